/* bench_pipe: the pipeline on one machine against the simulator.
 *
 * Config (b) (L4 H256 A4 F1024 V8192), seq 128, batch 32, 8 micro-batches of
 * 4: one stage on 2 threads against 2 stages of 1 thread each (the
 * in-process port, 1F1B).
 *
 * Each round, in this order:
 *   1. the profile: per-unit forward, backward and optimizer-step seconds
 *      of one micro-batch on one thread (dev_unit_times, the profile a
 *      device reports), taken
 *      twice: with the other core idle ("alone", what a device measures at
 *      enrollment) and with both cores profiling at once ("paired": the two
 *      stages of the pipeline also run at the same time, sharing the caches
 *      and the memory bus);
 *   2. the simulator's iteration time for the cut from each profile (the
 *      prediction);
 *   3. `steps` training steps of each trainer after one warm-up step: the
 *      median step of each.
 * The cut is the balancer's best for two equal devices given a profile
 * taken alone before the first round, and stays the same in every round. Rounds stop
 * early once `budget` seconds have passed (a loaded host slows everything
 * down; at least one round runs).
 *
 * Prints one JSON line per round; then one per stage: its measured time per
 * step by kind (medians over all measured steps) beside the simulator's;
 * then a summary: medians over rounds as [median, min, max], measured over
 * predicted as a ratio of medians and as the median [min, max] of the
 * per-round ratios (each round's prediction uses that round's profile). */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal.h"
#include "bench_util.h"
#include "dev_train.h"
#include "dev_unitprof.h"
#include "kn_backend.h"
#include "sl_mem.h"
#include "sl_time.h"

enum { B = 32, T = 128, M = 8, U = 6, REPS = 5, MAXR = 64 };

static const dev_config cfg = {.hidden = 256, .layers = 4, .heads = 4, .intermediate = 1024,
                               .vocab = 8192, .max_pos = 512, .type_vocab = 2, .ln_eps = 1e-12f,
                               .gelu = 0, .hidden_dropout = 0.1f, .attn_dropout = 0.1f,
                               .init_range = 0.02f};

static void die(const char *what, const sl_err *err)
{
    fprintf(stderr, "bench_pipe: %s: %s\n", what, err->msg);
    exit(1);
}

typedef struct profile {
    double fwd[U], bwd[U], opt[U];
} profile;

typedef struct prof_job {
    profile p;
    int rc;
    sl_err err;
} prof_job;

static void *prof_thread(void *arg)
{
    prof_job *j = arg;
    omp_set_num_threads(1);
    j->rc = dev_unit_times(&cfg, B / M, T, NULL, REPS, NULL, 0, j->p.fwd, j->p.bwd, j->p.opt,
                           &j->err);
    return NULL;
}

/* The profile on one thread; with paired, two threads profile at once and
 * each unit's time is the mean of theirs. */
static void take_profile(int paired, profile *out)
{
    prof_job j[2];
    pthread_t th[2];
    int n = paired ? 2 : 1;
    memset(j, 0, sizeof j);
    for (int k = 0; k < n; k++)
        if (pthread_create(&th[k], NULL, prof_thread, &j[k])) {
            fprintf(stderr, "bench_pipe: cannot start a thread\n");
            exit(1);
        }
    for (int k = 0; k < n; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < n; k++)
        if (j[k].rc)
            die("unit timing", &j[k].err);
    for (int u = 0; u < U; u++) {
        out->fwd[u] = (j[0].p.fwd[u] + j[n - 1].p.fwd[u]) / 2;
        out->bwd[u] = (j[0].p.bwd[u] + j[n - 1].p.bwd[u]) / 2;
        out->opt[u] = (j[0].p.opt[u] + j[n - 1].p.opt[u]) / 2;
    }
}

/* Two equal one-thread devices on one host with the profile p. cuts: the cut
 * to simulate, or (cuts[1] == 0) filled with the balancer's best. */
static bal_timeline *predict(const profile *p, const bal_unit *units, int nu, int *cuts)
{
    sl_err err = {0};
    bal_device dv[2];
    memset(dv, 0, sizeof dv);
    for (int d = 0; d < 2; d++) {
        snprintf(dv[d].id, sizeof dv[d].id, "thread%d", d);
        snprintf(dv[d].site, sizeof dv[d].site, "here");
        snprintf(dv[d].host, sizeof dv[d].host, "this");
        snprintf(dv[d].backend, sizeof dv[d].backend, "cpu");
        dv[d].mem_bytes = 8ull << 30;
        dv[d].flops = 5e10;
        dv[d].unit_fwd_s = p->fwd;
        dv[d].unit_bwd_s = p->bwd;
        dv[d].unit_optim_s = p->opt;
    }
    bal_network net = bal_network_default();
    net.same_host = (bal_link){.bw = 10e9, .lat = 5e-6}; /* a memcpy between threads */
    bal_problem *pb = bal_problem_new(units, nu, dv, 2, &net, &err);
    if (!pb)
        die("planning", &err);
    int order[2] = {0, 1};
    bal_chain ch = {.p = 2, .order = order, .extra = NULL, .m = M, .schedule = BAL_1F1B,
                    .window = 1};
    if (!cuts[1] && bal_chain_best(pb, &ch, cuts) >= 1e300) {
        fprintf(stderr, "bench_pipe: planning: no cut fits\n");
        exit(1);
    }
    bal_plan *pl = bal_plan_chain(pb, &ch, cuts, &err);
    bal_timeline *tl = pl ? bal_simulate(pl, BAL_1F1B, 0, &err) : NULL;
    if (!tl)
        die("planning", &err);
    bal_plan_free(pl);
    bal_problem_free(pb);
    return tl;
}

/* What the pipeline's stages spent, per step: computing forward, backward,
 * in port calls (waiting for the neighbour included), in the step's sync
 * (gradient finish, tied-embedding exchange, the norm's gather: waiting for
 * the other stage's last backward included) and in the optimizer update. */
enum { K_FWD, K_BWD, K_PORT, K_SYNC, K_OPTIM, NK };

typedef struct samples {
    double *v[2][NK];
    int n;
} samples;

/* Median seconds per step of `steps` steps after one warm-up; with s, each
 * stage's times of every measured step are added to it. */
static double run(dev_train *tr, const dev_batch *b, int steps, samples *s)
{
    dev_optim o;
    dev_optim_default(&o);
    dev_step_info info;
    sl_err err = {0};
    double *dt = sl_xmalloc((size_t)steps * sizeof *dt);
    for (int k = -1; k < steps; k++) {
        double t0 = sl_now_s();
        if (dev_train_step(tr, b, &o, &info, &err))
            die("training", &err);
        if (k < 0)
            continue;
        dt[k] = sl_now_s() - t0;
        for (int i = 0; s && i < 2; i++) {
            dev_pipe *pp = dev_train_pipe(tr, i);
            dev_pipe_times t;
            dev_pipe_times_get(pp, &t);
            const dev_pipe_seg *sg;
            int ns = dev_pipe_segments(pp, &sg);
            double sync = 0, optim = 0;
            for (int q = 0; q < ns; q++) {
                sync += sg[q].kind == DEV_SEG_SYNC ? sg[q].end - sg[q].start : 0;
                optim += sg[q].kind == DEV_SEG_OPTIM ? sg[q].end - sg[q].start : 0;
            }
            s->v[i][K_FWD][s->n] = t.fwd_s;
            s->v[i][K_BWD][s->n] = t.bwd_s;
            s->v[i][K_PORT][s->n] = t.recv_s + t.send_s;
            s->v[i][K_SYNC][s->n] = sync;
            s->v[i][K_OPTIM][s->n] = optim;
        }
        if (s)
            s->n++;
    }
    double med = bench_median(dt, steps);
    free(dt);
    return med;
}

static double sum_units(const profile *p)
{
    double s = 0;
    for (int u = 0; u < U; u++)
        s += p->fwd[u] + p->bwd[u];
    return s;
}

static void print_profile(const char *name, const profile *p)
{
    printf("\"%s\": {\"fwd_s\": [", name);
    for (int u = 0; u < U; u++)
        printf("%s%.5f", u ? ", " : "", p->fwd[u]);
    printf("], \"bwd_s\": [");
    for (int u = 0; u < U; u++)
        printf("%s%.5f", u ? ", " : "", p->bwd[u]);
    printf("]}");
}

/* median, min and max of v[0..n) (sorts v) */
static void spread(double *v, int n, double *med, double *lo, double *hi)
{
    *med = bench_median(v, n);
    *lo = v[0];
    *hi = v[n - 1];
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 5, rounds = argc > 2 ? atoi(argv[2]) : 5;
    double budget = argc > 3 ? atof(argv[3]) : 90;
    if (steps < 1 || rounds < 1 || rounds > MAXR || budget <= 0) {
        fprintf(stderr, "usage: bench_pipe [steps] [rounds (1..%d)] [budget seconds]\n", MAXR);
        return 2;
    }
    if (dev_unit_count(&cfg) != U) {
        fprintf(stderr, "bench_pipe: config (b) has %d units\n", dev_unit_count(&cfg));
        return 1;
    }
    double t_start = sl_now_s();
    sl_err err = {0};
    bal_bert bb = {.hidden = cfg.hidden, .layers = cfg.layers, .heads = cfg.heads,
                   .intermediate = cfg.intermediate, .vocab = cfg.vocab, .max_pos = cfg.max_pos,
                   .type_vocab = cfg.type_vocab};
    bal_unit *units = NULL;
    int nu = 0;
    if (bal_bert_units(&bb, B / M, T, &units, &nu, &err))
        die("units", &err);

    /* the cut, from a first profile taken alone */
    omp_set_num_threads(1);
    kn_blas_set_threads(1);
    profile p0;
    take_profile(0, &p0);
    int cuts[3] = {0, 0, 0};
    bal_timeline_free(predict(&p0, units, nu, cuts));

    int one[2] = {0, U}, two[3] = {0, cuts[1], U};
    dev_train_opts o1 = {.schedule = BAL_1F1B}, o2 = {.schedule = BAL_1F1B, .stage_threads = 1};
    dev_train *single = dev_train_open(&cfg, one, 1, B, T, M, 1, &o1, &err);
    dev_train *pipe = single ? dev_train_open(&cfg, two, 2, B, T, M, 1, &o2, &err) : NULL;
    if (!pipe)
        die("trainers", &err);
    size_t n = (size_t)B * T;
    int32_t *tok = sl_xmalloc(n * 4), *seg = sl_xcalloc(n, 4), *valid = sl_xmalloc(n * 4),
            *lab = sl_xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        tok[i] = 5 + (int32_t)((i * 2654435761u) % (uint32_t)(cfg.vocab - 5));
        valid[i] = 1;
        int r = (int)(i % 20);
        lab[i] = (r == 0 || r == 7 || r == 13) ? 5 + (int32_t)((i * 40503u) % (uint32_t)(cfg.vocab - 5)) : -100;
    }
    dev_batch b = {.B = B, .T = T, .tokens = tok, .segments = seg, .valid = valid, .labels = lab};

    /* per round: one stage, two stages, predicted alone, predicted paired,
     * the two ratios, and the units' sum on one thread (alone, paired) */
    enum { R_ONE, R_TWO, R_PRED, R_PRED2, R_RATIO, R_RATIO2, R_SUM, R_SUM2, NR };
    double *rv[NR];
    for (int k = 0; k < NR; k++)
        rv[k] = sl_xmalloc((size_t)rounds * sizeof(double));
    /* the simulator's per-stage busy times (alone profile), per round */
    double *sim[2][3];
    samples s = {.n = 0};
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 3; k++)
            sim[i][k] = sl_xmalloc((size_t)rounds * sizeof(double));
        for (int k = 0; k < NK; k++)
            s.v[i][k] = sl_xmalloc((size_t)rounds * (size_t)steps * sizeof(double));
    }
    int nr = 0;
    for (int r = 0; r < rounds && (r == 0 || sl_now_s() - t_start < budget); r++, nr++) {
        profile pa, pp;
        omp_set_num_threads(1);
        kn_blas_set_threads(1);
        take_profile(0, &pa);
        take_profile(1, &pp);
        bal_timeline *ta = predict(&pa, units, nu, cuts), *tp = predict(&pp, units, nu, cuts);
        rv[R_PRED][r] = ta->iteration_s;
        rv[R_PRED2][r] = tp->iteration_s;
        for (int i = 0; i < 2; i++) {
            sim[i][0][r] = ta->stage[i].fwd_s;
            sim[i][1][r] = ta->stage[i].bwd_s;
            sim[i][2][r] = ta->stage[i].optim_s;
        }
        bal_timeline_free(ta);
        bal_timeline_free(tp);
        rv[R_SUM][r] = sum_units(&pa) * M;
        rv[R_SUM2][r] = sum_units(&pp) * M;
        omp_set_num_threads(2);
        kn_blas_set_threads(2);
        rv[R_ONE][r] = run(single, &b, steps, NULL);
        rv[R_TWO][r] = run(pipe, &b, steps, &s);
        rv[R_RATIO][r] = rv[R_TWO][r] / rv[R_PRED][r];
        rv[R_RATIO2][r] = rv[R_TWO][r] / rv[R_PRED2][r];
        printf("{\"round\": %d, ", r);
        print_profile("profile_alone", &pa);
        printf(", ");
        print_profile("profile_paired", &pp);
        printf(", \"one_stage_2_threads_s\": %.4f, \"two_stages_1_thread_s\": %.4f, "
               "\"predicted_s\": %.4f, \"predicted_paired_s\": %.4f, "
               "\"measured_over_predicted\": %.3f, \"measured_over_predicted_paired\": %.3f}\n",
               rv[R_ONE][r], rv[R_TWO][r], rv[R_PRED][r], rv[R_PRED2][r], rv[R_RATIO][r],
               rv[R_RATIO2][r]);
        fflush(stdout);
    }
    double med[NR], lo[NR], hi[NR];
    for (int k = 0; k < NR; k++)
        spread(rv[k], nr, &med[k], &lo[k], &hi[k]);
    for (int i = 0; i < 2; i++) {
        double m[NK], sm[3];
        for (int k = 0; k < NK; k++)
            m[k] = bench_median(s.v[i][k], s.n);
        for (int k = 0; k < 3; k++)
            sm[k] = bench_median(sim[i][k], nr);
        printf("{\"stage\": %d, \"units\": \"%d-%d\", \"measured\": {\"fwd_s\": %.4f, "
               "\"bwd_s\": %.4f, \"port_s\": %.4f, \"sync_s\": %.4f, \"optim_s\": %.4f}, "
               "\"simulated\": {\"fwd_s\": %.4f, \"bwd_s\": %.4f, \"optim_s\": %.4f}}\n",
               i, cuts[i], cuts[i + 1] - 1, m[K_FWD], m[K_BWD], m[K_PORT], m[K_SYNC], m[K_OPTIM],
               sm[0], sm[1], sm[2]);
    }
    printf("{\"summary\": true, \"config\": \"b\", \"batch\": %d, \"seq\": %d, "
           "\"micro_batches\": %d, \"cut\": \"0-%d,%d-%d\", \"rounds\": %d, \"steps\": %d, "
           "\"seconds\": %.0f, \"one_stage_2_threads_s\": [%.4f, %.4f, %.4f], "
           "\"two_stages_1_thread_s\": [%.4f, %.4f, %.4f], \"one_stage_tokens_per_s\": %.0f, "
           "\"two_stages_tokens_per_s\": %.0f, \"two_over_one\": %.3f, "
           "\"predicted_s\": [%.4f, %.4f, %.4f], \"predicted_paired_s\": [%.4f, %.4f, %.4f], "
           "\"predicted_one_thread_s\": %.4f, \"predicted_one_thread_paired_s\": %.4f, "
           "\"measured_over_predicted\": %.3f, \"per_round\": [%.3f, %.3f, %.3f], "
           "\"measured_over_predicted_paired\": %.3f, \"per_round_paired\": [%.3f, %.3f, %.3f]}\n",
           B, T, M, cuts[1] - 1, cuts[1], U - 1, nr, steps, sl_now_s() - t_start, med[R_ONE],
           lo[R_ONE], hi[R_ONE], med[R_TWO], lo[R_TWO], hi[R_TWO], (double)n / med[R_ONE],
           (double)n / med[R_TWO], med[R_ONE] / med[R_TWO], med[R_PRED], lo[R_PRED], hi[R_PRED],
           med[R_PRED2], lo[R_PRED2], hi[R_PRED2], med[R_SUM], med[R_SUM2],
           med[R_TWO] / med[R_PRED], med[R_RATIO], lo[R_RATIO], hi[R_RATIO],
           med[R_TWO] / med[R_PRED2], med[R_RATIO2], lo[R_RATIO2], hi[R_RATIO2]);
    dev_train_free(single);
    dev_train_free(pipe);
    free(units);
    for (int k = 0; k < NR; k++)
        free(rv[k]);
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 3; k++)
            free(sim[i][k]);
        for (int k = 0; k < NK; k++)
            free(s.v[i][k]);
    }
    free(tok);
    free(seg);
    free(valid);
    free(lab);
    return 0;
}
