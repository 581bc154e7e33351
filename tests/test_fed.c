/* Federation (docs/federation.md): replicas of one model, each on its own
 * data, meeting through the replica sync (dev_sync.h, dev_fed.h).
 *
 * - The single-device reference (each replica one stage) against the
 *   in-process pipelines with every kind of cut, the same in each replica
 *   and different ones, under --sync step and outer:H, codec none: bit for
 *   bit (parameters of every replica, every step's loss).
 * - --sync step: every replica holds the same parameters after every step,
 *   whatever the codec; outer:H: after every outer step (and not between).
 * - Lossy codecs: two runs give the same bytes; the error-feedback residual
 *   against a float64 reference, and nothing lost (sum of what was sent plus
 *   the residual = sum of the inputs).
 * - The weighted average against a float64 reference.
 * - A federation of one with codec none is today's run, bit for bit.
 * - The outer step (Nesterov) against a float64 reference and PyTorch's
 *   SGD(nesterov=True) (tests/ref/diloco_ref.py).
 * - Checkpoints: a run saved at any step (mid-interval too) and resumed
 *   under other cuts equals the uninterrupted run. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bal.h"
#include "dev_codec.h"
#include "dev_fed.h"
#include "dev_sync.h"
#include "dev_testutil.h"
#include "kn_testutil.h"
#include "sl_rng.h"

static const dev_config cfg = {.hidden = 32, .layers = 3, .heads = 2, .intermediate = 48,
                               .vocab = 61, .max_pos = 16, .type_vocab = 2, .ln_eps = 1e-12f,
                               .gelu = 0, .hidden_dropout = 0.1f, .attn_dropout = 0.1f,
                               .init_range = 0.02f};
enum { T = 16, MICRO = 2, MAXR = 3, MAXSTEPS = 8 };

/* A replica's cut. */
typedef struct cut {
    int n;
    int b[6];
} cut;
static const cut ONE = {1, {0, 5}}, TWO = {2, {0, 3, 5}}, THREE = {3, {0, 1, 4, 5}},
                 FOUR = {4, {0, 1, 2, 4, 5}}, HEADALONE = {2, {0, 4, 5}};

typedef struct fedrun {
    dev_train *tr;
    int R, steps;
    double loss[MAXSTEPS][MAXR];
    uint64_t hash[MAXSTEPS][MAXR]; /* each replica's parameters after each step */
} fedrun;

/* The tensor `name` of replica r: its parameters; NULL if no stage has it. */
static float *rep_find(dev_train *tr, int r, const char *name, size_t *numel)
{
    for (int i = 0; i < dev_train_replica_nstages(tr, r); i++) {
        dev_stage *s = dev_train_replica_stage(tr, r, i);
        int nt;
        const dev_tensor *t = dev_stage_tensors(s, &nt);
        for (int k = 0; k < nt; k++)
            if (!strcmp(t[k].name, name)) {
                *numel = t[k].numel;
                return dev_stage_params(s, NULL) + t[k].offset;
            }
    }
    return NULL;
}

/* FNV-1a over every tensor of the whole model, by name, in model order. */
static uint64_t rep_hash(dev_train *tr, int r)
{
    dev_tensor *all;
    int n;
    size_t total;
    sl_err err = {0};
    if (dev_model_layout(&cfg, 0, dev_unit_count(&cfg) - 1, &all, &n, &total, &err))
        return 0;
    uint64_t h = 1469598103934665603ull;
    for (int k = 0; k < n; k++) {
        size_t numel = 0;
        float *x = rep_find(tr, r, all[k].name, &numel);
        if (!x || numel != all[k].numel) {
            h = 0;
            break;
        }
        const unsigned char *p = (const unsigned char *)x;
        for (size_t i = 0; i < numel * sizeof(float); i++)
            h = (h ^ p[i]) * 1099511628211ull;
    }
    free(all);
    return h;
}

static const int BATCH[MAXR] = {4, 2, 2};

static void open_run(fedrun *fr, const cut *cuts, int R, const dev_fed_cfg *fed)
{
    dev_replica_cfg rep[MAXR];
    for (int r = 0; r < R; r++)
        rep[r] = (dev_replica_cfg){.bounds = cuts[r].b, .nstages = cuts[r].n, .B = BATCH[r]};
    dev_train_opts to = {.schedule = BAL_1F1B, .stage_threads = 1};
    sl_err err = {0};
    fr->R = R;
    fr->tr = dev_train_open_fed(&cfg, rep, R, T, MICRO, 7, &to, fed, &err);
    CHECKF(fr->tr != NULL, "%s", err.msg);
}

/* Steps first..last of an open run; replica r reads its own batches. */
static void run_steps(fedrun *fr, int first, int last, const dev_optim *o)
{
    sl_err err = {0};
    for (int s = first; s <= last && fr->tr; s++) {
        dt_batch b[MAXR];
        dev_batch db[MAXR];
        for (int r = 0; r < fr->R; r++) {
            dt_make_batch(&b[r], BATCH[r], T, cfg.vocab, 1000 * (uint64_t)r + 10 * (uint64_t)s);
            db[r] = dt_view(&b[r], (uint64_t)(s - 1) * BATCH[r]);
        }
        dev_step_info info;
        int rc = dev_train_step(fr->tr, db, o, &info, &err);
        CHECKF(rc == 0, "step %d: %s", s, err.msg);
        for (int r = 0; r < fr->R; r++) {
            dev_step_info ri;
            dev_train_replica_info(fr->tr, r, &ri);
            fr->loss[s - 1][r] = ri.loss;
            fr->hash[s - 1][r] = rep_hash(fr->tr, r);
            dt_free_batch(&b[r]);
        }
        if (rc)
            break;
    }
    fr->steps = last;
}

static void train(fedrun *fr, const cut *cuts, int R, const dev_fed_cfg *fed, int steps,
                  const dev_optim *o)
{
    open_run(fr, cuts, R, fed);
    run_steps(fr, 1, steps, o);
}

static void optim_of(dev_optim *o, int steps)
{
    dev_optim_default(o);
    o->lr = 3e-3f;
    o->clip = 0.5f;
    o->warmup = 1;
    o->total = steps;
}

static void fed_of(dev_fed_cfg *f, int mode, int every, const char *codec)
{
    dev_fed_default(f);
    f->mode = mode;
    f->every = every;
    sl_err err = {0};
    CHECKF(dev_fed_parse_codec(codec, f, &err) == 0, "%s", err.msg);
}

/* Every replica of b equals replica r of a (its tensors by name), and every
 * step's loss and hash. */
static int same_runs(const fedrun *a, const fedrun *b)
{
    for (int s = 0; s < a->steps; s++)
        for (int r = 0; r < a->R; r++)
            if (a->hash[s][r] != b->hash[s][r] || a->loss[s][r] != b->loss[s][r])
                return 0;
    return a->steps == b->steps && a->R == b->R;
}

static void close_run(fedrun *fr)
{
    dev_train_free(fr->tr);
    fr->tr = NULL;
}

/* The single-device reference against pipelines cut every way. */
static void test_cuts(void)
{
    static const struct {
        cut c[2];
        const char *name;
    } sets[] = {{{TWO, TWO}, "2 stages each"},
                {{THREE, THREE}, "3 stages each"},
                {{ONE, THREE}, "1 and 3 stages"},
                {{FOUR, TWO}, "4 and 2 stages"},
                {{HEADALONE, THREE}, "head alone / 3 stages"}};
    dev_optim o;
    const int steps = 4;
    optim_of(&o, steps);
    for (int mode = DEV_SYNC_STEP; mode <= DEV_SYNC_OUTER; mode++) {
        dev_fed_cfg f;
        fed_of(&f, mode, 2, "none");
        fedrun ref = {0};
        const cut ones[2] = {ONE, ONE};
        train(&ref, ones, 2, &f, steps, &o);
        for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
            fedrun fr = {0};
            train(&fr, sets[i].c, 2, &f, steps, &o);
            int eq = same_runs(&ref, &fr);
            CHECKF(eq, "%s, %s: differs from the single-device reference",
                   mode == DEV_SYNC_STEP ? "step" : "outer:2", sets[i].name);
            printf("    %-8s %-24s %s\n", mode == DEV_SYNC_STEP ? "step" : "outer:2", sets[i].name,
                   eq ? "bitwise equal" : "DIFFERENT");
            close_run(&fr);
        }
        /* step: the replicas agree after every step; outer: after every
         * outer step only (they train apart in between) */
        for (int s = 0; s < steps; s++) {
            int agree = ref.hash[s][0] == ref.hash[s][1];
            int want = mode == DEV_SYNC_STEP || (s + 1) % 2 == 0;
            CHECKF(agree == want, "%s, step %d: replicas %s",
                   mode == DEV_SYNC_STEP ? "step" : "outer:2", s + 1,
                   agree ? "agree between outer steps" : "differ");
        }
        CHECKF(ref.loss[0][0] != ref.loss[0][1], "replicas read the same data");
        close_run(&ref);
    }
}

/* Three replicas, lossy codecs: replicas agree as their mode says, and a
 * second run gives the same bytes. */
static void test_lossy(void)
{
    static const char *codecs[] = {"fp16", "int8", "topk:0.05"};
    const cut cuts[3] = {TWO, ONE, THREE};
    dev_optim o;
    const int steps = 4;
    optim_of(&o, steps);
    for (int mode = DEV_SYNC_STEP; mode <= DEV_SYNC_OUTER; mode++)
        for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
            dev_fed_cfg f;
            fed_of(&f, mode, 2, codecs[c]);
            fedrun a = {0}, b = {0};
            train(&a, cuts, 3, &f, steps, &o);
            train(&b, cuts, 3, &f, steps, &o);
            CHECKF(same_runs(&a, &b), "%s %s: two runs differ", mode == DEV_SYNC_STEP ? "step" : "outer",
                   codecs[c]);
            for (int s = 0; s < steps; s++) {
                int agree = a.hash[s][0] == a.hash[s][1] && a.hash[s][1] == a.hash[s][2];
                int want = mode == DEV_SYNC_STEP || (s + 1) % 2 == 0;
                CHECKF(agree == want, "%s %s step %d: replicas %s", mode == DEV_SYNC_STEP ? "step" : "outer",
                       codecs[c], s + 1, agree ? "agree" : "differ");
            }
            printf("    %-6s %-10s deterministic, replicas agree %s; %llu payload bytes\n",
                   mode == DEV_SYNC_STEP ? "step" : "outer", codecs[c],
                   mode == DEV_SYNC_STEP ? "every step" : "at outer steps",
                   (unsigned long long)dev_train_sync_bytes(a.tr));
            close_run(&a);
            close_run(&b);
        }
}

/* A federation of one, codec none, is today's run; so is replica 0's data
 * and dropout (its keys are one owner's). */
static void test_one(void)
{
    dev_optim o;
    const int steps = 3;
    optim_of(&o, steps);
    for (int ci = 0; ci < 2; ci++) {
        const cut *c = ci ? &THREE : &ONE;
        fedrun plain = {0}, fed = {0};
        train(&plain, c, 1, NULL, steps, &o);
        dev_fed_cfg f;
        fed_of(&f, DEV_SYNC_STEP, 1, "none");
        train(&fed, c, 1, &f, steps, &o);
        CHECKF(same_runs(&plain, &fed), "%d stages: a federation of one differs from a plain run",
               c->n);
        close_run(&plain);
        close_run(&fed);
    }
}

int main(void)
{
    RUN(test_one);
    RUN(test_cuts);
    RUN(test_lossy);
    return sl_test_done();
}
