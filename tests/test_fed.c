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
#include <float.h>
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
#include "kn_shadow.h"
#include "kn_testutil.h"
#include "sl_config.h"
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
    for (int i = 0; i < dev_train_replica_nstages(tr, r); i++) /* a resident backend's host view */
        if (dev_stage_pull_params(dev_train_replica_stage(tr, r, i), &err))
            h = 0;
    for (int k = 0; k < n && h; k++) {
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
static const kn_be *g_be; /* the stages' backend (NULL: the CPU) */

static void open_run(fedrun *fr, const cut *cuts, int R, const dev_fed_cfg *fed)
{
    dev_replica_cfg rep[MAXR];
    for (int r = 0; r < R; r++)
        rep[r] = (dev_replica_cfg){.bounds = cuts[r].b, .nstages = cuts[r].n, .B = BATCH[r]};
    dev_train_opts to = {.schedule = BAL_1F1B, .stage_threads = 1, .be = g_be};
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
            db[r] = dt_view(&b[r]);
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

/* A normal-ish number from the counter RNG. */
static float rnd(uint64_t stream, uint64_t i)
{
    float u = sl_rng_uniform(99, stream, 2 * i), v = sl_rng_uniform(99, stream, 2 * i + 1);
    return (u + v - 1.0f) * 1.7f;
}

/* The weighted average: dev_sync_combine against a long-double sum of the
 * decoded payloads, for three replicas of unequal weights. */
static void test_combine(void)
{
    enum { N = 4096, COLS = 64, R = 3 };
    static const int batch[R] = {5, 3, 3};
    static const char *codecs[] = {"none", "fp16", "int8", "topk:0.1"};
    for (size_t ci = 0; ci < sizeof codecs / sizeof codecs[0]; ci++) {
        dev_fed_cfg f;
        fed_of(&f, DEV_SYNC_STEP, 1, codecs[ci]);
        dev_sync_weights(&f.sync, batch, R);
        size_t len = dev_sync_payload_len(&f.sync, N, COLS), k = dev_sync_k(&f.sync, N);
        float *x = malloc(N * sizeof *x), *dec = malloc((size_t)R * N * sizeof *dec);
        float *out = malloc(N * sizeof *out), *scratch = malloc((size_t)R * N * sizeof *scratch);
        uint8_t *pay[R];
        sl_err err = {0};
        for (int r = 0; r < R; r++) {
            for (size_t i = 0; i < N; i++) /* magnitudes over six decades */
                x[i] = rnd((uint64_t)r, i) * powf(10.0f, (float)(i % 7) - 4.0f);
            pay[r] = malloc(len);
            CHECKF(dev_codec_encode(f.sync.codec, x, N, COLS, k, NULL, pay[r], &err) == 0 &&
                   dev_codec_decode(f.sync.codec, pay[r], N, COLS, k, dec + (size_t)r * N, &err) == 0,
                   "%s", err.msg);
        }
        CHECKF(dev_sync_combine(&f.sync, (const uint8_t *const *)pay, N, COLS, out, scratch, &err) == 0,
               "%s", err.msg);
        double worst = 0;
        int exact = 1;
        for (size_t i = 0; i < N; i++) {
            long double ref = 0;
            double same = 0;
            for (int r = 0; r < R; r++) {
                ref += (long double)batch[r] / 11.0L * dec[(size_t)r * N + i];
                same += f.sync.weight[r] * (double)dec[(size_t)r * N + i];
            }
            exact &= out[i] == (float)same;
            float fr = (float)ref;
            double ulp = nextafterf(fabsf(fr), INFINITY) - fabsf(fr);
            double e = ref == 0 ? fabs(out[i]) : fabsl((long double)out[i] - ref) / ulp;
            worst = e > worst ? e : worst;
        }
        CHECKF(exact, "%s: not the double sum rounded once", codecs[ci]);
        CHECKF(worst <= 0.5001, "%s: %.4f ulp from the long-double weighted sum", codecs[ci], worst);
        printf("    %-9s within %.3f ulp of the long-double weighted sum (%zu payload bytes of %d floats)\n",
               codecs[ci], worst, len, N);
        /* replica 1's owner away (rounds 5..8): its payload is not read, and
         * the others are weighted 5/8 and 3/8 */
        f.sync.away_from[1] = 5;
        f.sync.away_to[1] = 8;
        double w4[DEV_SYNC_MAX_REPLICAS], w6[DEV_SYNC_MAX_REPLICAS];
        dev_sync_round_weights(&f.sync, 4, w4);
        dev_sync_round_weights(&f.sync, 6, w6);
        CHECK(w4[0] == f.sync.weight[0] && w4[1] == f.sync.weight[1] && w4[2] == f.sync.weight[2]);
        CHECK(w6[0] == 5.0 / 8.0 && w6[1] == 0.0 && w6[2] == 3.0 / 8.0);
        CHECK(dev_sync_present(&f.sync, 1, 4) && !dev_sync_present(&f.sync, 1, 5) &&
              !dev_sync_present(&f.sync, 1, 8) && dev_sync_present(&f.sync, 1, 9) &&
              dev_sync_present(&f.sync, 0, 6));
        dev_sync_cfg round6 = f.sync;
        memcpy(round6.weight, w6, sizeof w6);
        const uint8_t *present[R] = {pay[0], NULL, pay[2]};
        CHECKF(dev_sync_combine(&round6, present, N, COLS, out, scratch, &err) == 0, "%s", err.msg);
        exact = 1;
        for (size_t i = 0; i < N; i++)
            exact &= out[i] == (float)(5.0 / 8.0 * (double)dec[i] + 3.0 / 8.0 * (double)dec[2 * (size_t)N + i]);
        CHECKF(exact, "%s: replica 1 away, not the present replicas' sum renormalised", codecs[ci]);
        f.sync.away_from[1] = f.sync.away_to[1] = 0;
        /* a payload that does not decode is refused, naming its replica */
        if (f.sync.codec == DEV_CODEC_INT8) {
            pay[1][4 * (N / COLS) + 5] = 0x80;
            CHECK(dev_sync_combine(&f.sync, (const uint8_t *const *)pay, N, COLS, out, scratch, &err) == -1 &&
                  strstr(err.msg, "replica 1"));
        }
        for (int r = 0; r < R; r++)
            free(pay[r]);
        free(x);
        free(dec);
        free(out);
        free(scratch);
    }
}

/* Error feedback, one replica (whose result is its own decoded payload):
 * each step's residual against (x + e) - decoded in float64, and over the
 * steps nothing lost: sum of what was sent + the last residual = sum of the
 * inputs. */
static void test_feedback(void)
{
    static const char *codecs[] = {"fp16", "bf16", "int8", "topk:0.1", "topk:0.01"};
    enum { STEPS = 6 };
    int head = dev_unit_head(&cfg);
    for (size_t ci = 0; ci < sizeof codecs / sizeof codecs[0]; ci++) {
        sl_err err = {0};
        dev_fed_cfg f;
        fed_of(&f, DEV_SYNC_STEP, 1, codecs[ci]);
        int one = 1;
        dev_sync_hub *hub = dev_sync_hub_create(&f.sync, &one, &err);
        dev_stage *st = dev_stage_create(&cfg, 0, head, 2, T, 1, 7, NULL, 0, &err);
        dev_fed *fd = st && hub ? dev_fed_create(st, &f, dev_sync_hub_member(hub, 0, 0), &err) : NULL;
        CHECKF(fd != NULL, "%s", err.msg);
        if (!fd)
            continue;
        CHECK(dev_fed_begin(fd, &err) == 0);
        size_t np;
        float *g = dev_stage_grads(st, &np), *e = dev_fed_residual(fd);
        CHECK(e != NULL);
        double *in = calloc(np, sizeof *in), *sent = calloc(np, sizeof *sent), scale = 0;
        float *eprev = malloc(np * sizeof *eprev), *x = malloc(np * sizeof *x);
        double worst_step = 0;
        int nt;
        const dev_tensor *t = dev_stage_tensors(st, &nt);
        for (int s = 1; s <= STEPS; s++) {
            memcpy(eprev, e, np * sizeof *e);
            for (int k = 0; k < nt; k++)
                for (size_t i = t[k].offset; i < t[k].offset + t[k].numel; i++) {
                    x[i] = g[i] = rnd(1000 + (uint64_t)s, i) * 1e-3f;
                    scale = fabs(x[i]) > scale ? fabs(x[i]) : scale;
                }
            CHECKF(dev_fed_grads(fd, (uint64_t)s, &err) == 0, "%s: %s", codecs[ci], err.msg);
            for (int k = 0; k < nt; k++) {
                size_t sent_k = 0;
                for (size_t i = t[k].offset; i < t[k].offset + t[k].numel; i++) {
                    double y = (double)x[i] + (double)eprev[i], want = y - (double)g[i];
                    double tol = 2 * FLT_EPSILON * (fabs(y) + fabs((double)g[i])) + 1e-30;
                    double d = fabs((double)e[i] - want) / tol;
                    worst_step = d > worst_step ? d : worst_step;
                    in[i] += x[i];
                    sent[i] += g[i];
                    sent_k += g[i] != 0.0f;
                }
                if (f.sync.codec == DEV_CODEC_TOPK)
                    CHECKF(sent_k <= dev_sync_k(&f.sync, t[k].numel), "%s: %s sent %zu of %zu",
                           codecs[ci], t[k].name, sent_k, t[k].numel);
            }
        }
        double lost = 0;
        for (int k = 0; k < nt; k++)
            for (size_t i = t[k].offset; i < t[k].offset + t[k].numel; i++) {
                double l = fabs(sent[i] + e[i] - in[i]);
                lost = l > lost ? l : lost;
            }
        CHECKF(worst_step <= 1.0, "%s: a residual %.3g of its rounding bound from float64", codecs[ci],
               worst_step);
        CHECKF(lost <= 1e-5 * scale * STEPS, "%s: %.3g lost over %d steps", codecs[ci], lost, STEPS);
        printf("    %-9s residual within %.2f of its rounding bound; over %d steps sent + residual - "
               "inputs = %.2g (inputs up to %.2g)\n", codecs[ci], worst_step, STEPS, lost, scale);
        free(in);
        free(sent);
        free(eprev);
        free(x);
        dev_fed_free(fd);
        dev_stage_free(st);
        dev_sync_hub_free(hub);
    }
}

typedef struct outer_job {
    dev_fed *f;
    uint64_t step;
    int rc;
    sl_err err;
} outer_job;

static void *outer_thread(void *arg)
{
    outer_job *j = arg;
    j->rc = dev_fed_outer(j->f, j->step, &j->err);
    return NULL;
}

/* Two outer steps of two replicas (weights 2/3 and 1/3), each moved
 * apart before them, against float64 and against PyTorch's
 * SGD(nesterov=True) on the pseudo-gradient (tests/ref/diloco_ref.py). */
static void test_outer_step(void)
{
    enum { R = 2, ROUNDS = 2 };
    static const int batch[R] = {4, 2};
    int head = dev_unit_head(&cfg);
    sl_err err = {0};
    dev_fed_cfg f;
    fed_of(&f, DEV_SYNC_OUTER, 3, "none");
    f.outer_lr = 0.7f;
    f.outer_momentum = 0.9f;
    dev_sync_weights(&f.sync, batch, R);
    int ones[R] = {1, 1};
    dev_sync_hub *hub = dev_sync_hub_create(&f.sync, ones, &err);
    dev_stage *st[R];
    dev_fed *fd[R];
    for (int r = 0; r < R; r++) {
        st[r] = dev_stage_create(&cfg, 0, head, 2, T, 1, 7, NULL, 0, &err);
        fd[r] = dev_fed_create(st[r], &f, dev_sync_hub_member(hub, r, 0), &err);
        CHECKF(fd[r] && dev_fed_begin(fd[r], &err) == 0, "%s", err.msg);
        if (!fd[r])
            return;
    }
    size_t np;
    dev_stage_params(st[0], &np);
    int nt;
    const dev_tensor *t = dev_stage_tensors(st[0], &nt);
    char dir[] = "/tmp/skyloom-diloco-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/outer.in", dir);
    FILE *in = fopen(path, "wb");
    int32_t hdr[3] = {(int32_t)np, R, ROUNDS};
    double lrmu[2] = {f.outer_lr, f.outer_momentum};
    fwrite(hdr, sizeof hdr, 1, in);
    fwrite(f.sync.weight, sizeof(double), R, in);
    fwrite(lrmu, sizeof lrmu, 1, in);
    fwrite(dev_fed_outer_params(fd[0]), sizeof(float), np, in);
    /* float64 reference of the outer parameters and momentum */
    double *th = malloc(np * sizeof *th), *v = calloc(np, sizeof *v);
    for (size_t i = 0; i < np; i++)
        th[i] = dev_fed_outer_params(fd[0])[i];
    float *ours = malloc((size_t)ROUNDS * np * sizeof *ours);
    double worst = 0;
    for (int round = 0; round < ROUNDS; round++) {
        double *D = calloc(np, sizeof *D);
        for (int r = 0; r < R; r++) {
            float *p = dev_stage_params(st[r], NULL);
            for (int k = 0; k < nt; k++) /* what H inner steps might have done */
                for (size_t i = t[k].offset; i < t[k].offset + t[k].numel; i++) {
                    p[i] += rnd(500 + 10 * (uint64_t)round + (uint64_t)r, i) * 1e-3f;
                    D[i] += f.sync.weight[r] * (th[i] - (double)p[i]);
                }
            fwrite(p, sizeof(float), np, in);
        }
        outer_job job[R];
        pthread_t tid[R];
        for (int r = 0; r < R; r++) {
            job[r] = (outer_job){.f = fd[r], .step = 3 * ((uint64_t)round + 1)};
            pthread_create(&tid[r], NULL, outer_thread, &job[r]);
        }
        for (int r = 0; r < R; r++) {
            pthread_join(tid[r], NULL);
            CHECKF(job[r].rc == 0, "%s", job[r].err.msg);
        }
        const float *p0 = dev_stage_params(st[0], NULL);
        CHECK(kt_bitwise_equal(p0, dev_stage_params(st[1], NULL), np));
        CHECK(kt_bitwise_equal(p0, dev_fed_outer_params(fd[1]), np));
        memcpy(ours + (size_t)round * np, p0, np * sizeof(float));
        for (int k = 0; k < nt; k++)
            for (size_t i = t[k].offset; i < t[k].offset + t[k].numel; i++) {
                v[i] = f.outer_momentum * v[i] + D[i];
                double step = f.outer_lr * (D[i] + f.outer_momentum * v[i]);
                th[i] -= step;
                /* a few roundings a round, carried over from the last */
                double e = fabs((double)p0[i] - th[i]) / (16 * FLT_EPSILON * (fabs(th[i]) + fabs(step)) + 1e-30);
                worst = e > worst ? e : worst;
            }
        free(D);
    }
    fclose(in);
    CHECKF(worst <= 1.0, "outer step %.3g of 16 ulp from float64", worst);
    printf("    two outer steps within %.2f of 16 ulp of float64; replicas bitwise equal\n",
           worst);
    const char *py = getenv("SKYLOOM_PYTHON");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s/tests/ref/diloco_ref.py %s", py ? py : "/usr/bin/python3",
             SKYLOOM_SOURCE_ROOT, dir);
    int rc = system(cmd);
    CHECKF(rc == 0, "reference script failed (%d): is python3-torch installed? (make deps)", rc);
    snprintf(path, sizeof path, "%s/outer.out", dir);
    FILE *out = rc == 0 ? fopen(path, "rb") : NULL;
    float *want = malloc((size_t)ROUNDS * np * sizeof *want);
    if (out && fread(want, sizeof(float), (size_t)ROUNDS * np, out) == (size_t)ROUNDS * np) {
        for (int round = 0; round < ROUNDS; round++) {
            double e = 0, big = 0;
            for (int k = 0; k < nt; k++)
                for (size_t i = t[k].offset; i < t[k].offset + t[k].numel; i++) {
                    size_t at = (size_t)round * np + i;
                    e = fmax(e, fabs((double)ours[at] - want[at]));
                    big = fmax(big, fabs((double)want[at]));
                }
            CHECKF(e <= 1e-6 * big, "outer step %d: %.3g from torch (largest %.3g)", round + 1, e, big);
            printf("    outer step %d: max |ours - torch SGD(nesterov)| = %.3g (largest value %.3g)\n",
                   round + 1, e, big);
        }
    } else
        CHECKF(0, "no %s", path);
    if (out)
        fclose(out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    free(want);
    free(ours);
    free(th);
    free(v);
    for (int r = 0; r < R; r++) {
        dev_fed_free(fd[r]);
        dev_stage_free(st[r]);
    }
    dev_sync_hub_free(hub);
}

static void *grads_thread(void *arg)
{
    outer_job *j = arg;
    j->rc = dev_fed_grads(j->f, j->step, &j->err);
    return NULL;
}

/* Replicas whose tensors disagree (another hidden size) fail the round,
 * both of them, naming the tensor, instead of waiting or mixing them. */
static void test_mismatch(void)
{
    sl_err err = {0};
    dev_fed_cfg f;
    fed_of(&f, DEV_SYNC_STEP, 1, "none");
    int b[2] = {2, 2}, ones[2] = {1, 1};
    dev_sync_weights(&f.sync, b, 2);
    dev_config wide = cfg;
    wide.hidden = 48;
    wide.heads = 3;
    dev_sync_hub *hub = dev_sync_hub_create(&f.sync, ones, &err);
    dev_stage *s0 = dev_stage_create(&cfg, 0, dev_unit_head(&cfg), 2, T, 1, 7, NULL, 0, &err);
    dev_stage *s1 = dev_stage_create(&wide, 0, dev_unit_head(&wide), 2, T, 1, 7, NULL, 0, &err);
    dev_fed *f0 = dev_fed_create(s0, &f, dev_sync_hub_member(hub, 0, 0), &err);
    dev_fed *f1 = dev_fed_create(s1, &f, dev_sync_hub_member(hub, 1, 0), &err);
    CHECKF(f0 && f1, "%s", err.msg);
    outer_job j[2] = {{.f = f0, .step = 1}, {.f = f1, .step = 1}};
    pthread_t tid[2];
    for (int r = 0; r < 2; r++)
        pthread_create(&tid[r], NULL, grads_thread, &j[r]);
    for (int r = 0; r < 2; r++) {
        pthread_join(tid[r], NULL);
        CHECKF(j[r].rc == -1, "replica %d's round passed", r);
        printf("    replica %d: %s\n", r, j[r].err.msg);
    }
    CHECK(strstr(j[0].err.msg, "word_embeddings") || strstr(j[1].err.msg, "word_embeddings"));
    dev_fed_free(f0);
    dev_fed_free(f1);
    dev_stage_free(s0);
    dev_stage_free(s1);
    dev_sync_hub_free(hub);
}

/* On a resident backend (the shadow backend: host code touching a backend
 * buffer faults), the replica sync moves gradients and parameters through
 * pull and push: the CPU's bits, with lossy codecs too. */
static void test_resident(void)
{
    static const char *codecs[] = {"none", "int8"};
    const cut cuts[2] = {TWO, THREE};
    dev_optim o;
    const int steps = 4;
    optim_of(&o, steps);
    for (int mode = DEV_SYNC_STEP; mode <= DEV_SYNC_OUTER; mode++)
        for (int c = 0; c < 2; c++) {
            dev_fed_cfg f;
            fed_of(&f, mode, 2, codecs[c]);
            fedrun cpu = {0}, sh = {0};
            g_be = NULL;
            train(&cpu, cuts, 2, &f, steps, &o);
            kn_shadow_reset();
            g_be = &kn_shadow_be;
            train(&sh, cuts, 2, &f, steps, &o);
            g_be = NULL;
            CHECKF(same_runs(&cpu, &sh), "%s %s: the shadow backend differs from the CPU",
                   mode == DEV_SYNC_STEP ? "step" : "outer:2", codecs[c]);
            CHECKF(!kn_shadow_violation(), "%s", kn_shadow_violation());
            close_run(&cpu);
            close_run(&sh);
        }
    /* replica 1 away for steps 1..2 and back at the outer step 2: its
     * rejoin (the moments copied, the residual zeroed) on resident buffers */
    dev_fed_cfg f;
    fed_of(&f, DEV_SYNC_OUTER, 2, "int8");
    f.sync.away_from[1] = 1;
    f.sync.away_to[1] = 2;
    fedrun cpu = {0}, sh = {0};
    g_be = NULL;
    train(&cpu, cuts, 2, &f, steps, &o);
    kn_shadow_reset();
    g_be = &kn_shadow_be;
    train(&sh, cuts, 2, &f, steps, &o);
    g_be = NULL;
    CHECKF(same_runs(&cpu, &sh), "outer:2 int8, replica 1 away 1-2: the shadow backend differs");
    CHECKF(!kn_shadow_violation(), "%s", kn_shadow_violation());
    close_run(&cpu);
    close_run(&sh);
}

/* A replica whose step fails (here: a batch of the wrong size) stops the
 * others instead of leaving them waiting in the sync, the error named is
 * its own, and the next step runs. */
static void test_failure(void)
{
    const cut cuts[2] = {TWO, ONE};
    dev_optim o;
    optim_of(&o, 4);
    for (int mode = DEV_SYNC_STEP; mode <= DEV_SYNC_OUTER; mode++) {
        dev_fed_cfg f;
        fed_of(&f, mode, 1, "none");
        fedrun fr = {0};
        open_run(&fr, cuts, 2, &f);
        if (!fr.tr)
            continue;
        dt_batch b0, b1;
        dt_make_batch(&b0, BATCH[0], T, cfg.vocab, 1);
        dt_make_batch(&b1, BATCH[1] + 2, T, cfg.vocab, 2);
        dev_batch db[2] = {dt_view(&b0), dt_view(&b1)};
        dev_step_info info;
        sl_err err = {0};
        CHECK(dev_train_step(fr.tr, db, &o, &info, &err) == -1);
        printf("    %s: %s\n", mode == DEV_SYNC_STEP ? "step" : "outer:1", err.msg);
        CHECK(strstr(err.msg, "replica 1") && strstr(err.msg, "batch 4x16"));
        /* under step no replica updated (they all wait for the reduce first),
         * so the run goes on; under outer:1 replica 0 did: as after any
         * failure, such a run stops or loads a checkpoint */
        if (mode == DEV_SYNC_STEP) {
            for (int i = 0; i < 2; i++)
                CHECK(dev_stage_get_step(dev_train_replica_stage(fr.tr, 0, i)) == 0);
            run_steps(&fr, 1, 2, &o);
            CHECK(fr.hash[1][0] == fr.hash[1][1]);
        }
        dt_free_batch(&b0);
        dt_free_batch(&b1);
        close_run(&fr);
    }
}

int main(void)
{
    RUN(test_one);
    RUN(test_cuts);
    RUN(test_lossy);
    RUN(test_combine);
    RUN(test_feedback);
    RUN(test_outer_step);
    RUN(test_mismatch);
    RUN(test_resident);
    RUN(test_failure);
    return sl_test_done();
}
