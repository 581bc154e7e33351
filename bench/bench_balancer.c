/* The balancer on the Sky Computing setting and beyond. Prints tables for
 * docs/balancer.md; asserts nothing about time.
 *
 *   1. 160-layer BERT (H 1024, 16 heads, I 4096, seq 128, micro-batch 8),
 *      64 devices over 4 sites, 128 and 256 micro-batches, on 20 seeds:
 *      even / sky / optimal, simulated iteration, speed-up, the certified
 *      gap to bal_lower_bound, planning time; median and worst.
 *   2. <= 8 devices: optimal vs the exhaustive search over every subset and
 *      order (each placed exactly), judged by the simulator; with and
 *      without a data owner (U-shaped chains).
 *   3. 12 devices: the exact subset search's time, and optimal's.
 *   4. planning time at 1,024 devices x 1,000 layers.
 *   5. federation: replicas placed against an equal share of the devices.
 * Usage: bench_balancer [first seed, default 11001] [--seeds N, default 20] [--quick]
 *        [--paper: the paper-setting tables only] [--fed: the federation table only] */
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "bal.h"
#include "sl_mem.h"
#include "sl_rng.h"

static uint64_t g_seed = 11001;

static double U(uint64_t stream, uint64_t i) { return sl_rng_uniform(g_seed, stream, i); }

typedef struct setting {
    int layers, hidden, heads, inter, vocab, seq, batch;
    int n_dev, n_sites;
    double speed_ratio;  /* fastest / slowest */
    double tflops_min;
    double gbps_between, lat_min_ms, lat_max_ms, gbps_inside;
    uint64_t stream;
} setting;

/* Devices: FLOP/s log-uniform in [tflops_min, ratio x tflops_min]; memory one
 * of 16, 24, 32, 40, 48, 80 GiB; site i % n_sites, listed site by site (so
 * even and sky also cross each inter-site link only once); site pairs 1
 * Gbit/s with latency uniform in [lat_min, lat_max]. */
static bal_problem *build(const setting *s, double *total_flops)
{
    bal_bert c = {.hidden = s->hidden, .layers = s->layers, .heads = s->heads,
                  .intermediate = s->inter, .vocab = s->vocab, .max_pos = 512, .type_vocab = 2};
    bal_unit *u;
    int n;
    sl_err err = {0};
    /* config.json allows BAL_MAX_LAYERS; a deeper chain repeats the layer unit */
    if (c.layers > BAL_MAX_LAYERS)
        c.layers = 1;
    if (bal_bert_units(&c, s->batch, s->seq, &u, &n, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    if (c.layers != s->layers) {
        bal_unit head = u[n - 1], layer = u[1];
        n = s->layers + 2;
        u = sl_xrealloc(u, (size_t)n * sizeof *u);
        for (int i = 1; i < n - 1; i++)
            u[i] = layer;
        u[n - 1] = head;
    }
    bal_device *d = sl_xcalloc((size_t)s->n_dev, sizeof *d);
    static const uint64_t gib[6] = {16, 24, 32, 40, 48, 80};
    *total_flops = 0;
    int k = 0;
    for (int site = 0; site < s->n_sites; site++)
        for (int i = site; i < s->n_dev; i += s->n_sites, k++) {
            bal_device *x = &d[k];
            snprintf(x->id, sizeof x->id, "dev%03d", i);
            snprintf(x->site, sizeof x->site, "site%d", site);
            strcpy(x->backend, "cuda");
            x->flops = 1e12 * s->tflops_min * exp(log(s->speed_ratio) * U(s->stream, 2 * i));
            x->mem_bytes = gib[(int)(U(s->stream, 2 * i + 1) * 6)] << 30;
            *total_flops += x->flops;
        }
    int np = s->n_sites * (s->n_sites - 1) / 2;
    bal_site_link *l = sl_xcalloc((size_t)np + 1, sizeof *l);
    k = 0;
    for (int a = 0; a < s->n_sites; a++)
        for (int b = a + 1; b < s->n_sites; b++, k++) {
            snprintf(l[k].a, sizeof l[k].a, "site%d", a);
            snprintf(l[k].b, sizeof l[k].b, "site%d", b);
            double ms = s->lat_min_ms + (s->lat_max_ms - s->lat_min_ms) *
                                            U(s->stream + 1, (uint64_t)k);
            l[k].link = (bal_link){s->gbps_between * 1e9 / 8, ms * 1e-3};
        }
    bal_network net = bal_network_default();
    net.inside_site = (bal_link){s->gbps_inside * 1e9 / 8, 1e-4};
    net.links = l;
    net.n_links = np;
    bal_problem *pb = bal_problem_new(u, n, d, s->n_dev, &net, &err);
    if (!pb) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    free(u);
    free(d);
    free(l);
    return pb;
}

/* CPU seconds of this process: the build machine is shared, so wall time
 * measures the neighbours as much as the planner. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Median planning CPU time of `reps` runs; *out: the last plan. */
static double plan_median(const bal_problem *pb, int algo, const bal_opts *o, int reps,
                          bal_plan **out)
{
    double t[16];
    *out = NULL;
    for (int r = 0; r < reps; r++) {
        sl_err err = {0};
        double t0 = cpu_s();
        bal_plan *pl = bal_plan_make(pb, algo, o, &err);
        t[r] = cpu_s() - t0;
        if (!pl) {
            printf("  %s: %s\n", bal_algo_name(algo), err.msg);
            return NAN;
        }
        bal_plan_free(*out);
        *out = pl;
    }
    qsort(t, (size_t)reps, sizeof(double), bench_cmp_double);
    return t[reps / 2];
}

/* Plans algo (median CPU time of reps) and simulates it; -1 if it does not fit. */
static int measure(const bal_problem *pb, int algo, const bal_opts *o, int reps, double *plan_s,
                   double *iter_s, int *stages)
{
    bal_plan *pl;
    *plan_s = plan_median(pb, algo, o, reps, &pl);
    if (!pl)
        return -1;
    sl_err err = {0};
    bal_timeline *tl = bal_simulate(pl, o->schedule, 0, &err);
    *iter_s = tl ? tl->iteration_s : NAN;
    *stages = pl->n_stages;
    bal_timeline_free(tl);
    bal_plan_free(pl);
    return 0;
}

static int cmp_double(const void *a, const void *b) { return bench_cmp_double(a, b); }

/* Plans algo once, simulates; the iteration, stages and planning CPU time. */
static int plan_once(const bal_problem *pb, int algo, const bal_opts *o, double *it, int *st,
                     double *cpu)
{
    sl_err err = {0};
    double t0 = cpu_s();
    bal_plan *pl = bal_plan_make(pb, algo, o, &err);
    *cpu = cpu_s() - t0;
    if (!pl) {
        printf("  %s: %s\n", bal_algo_name(algo), err.msg);
        return -1;
    }
    bal_timeline *tl = bal_simulate(pl, o->schedule, 0, &err);
    *it = tl ? tl->iteration_s : NAN;
    *st = pl->n_stages;
    bal_timeline_free(tl);
    bal_plan_free(pl);
    return 0;
}

/* The paper's setting on `count` seeds from g_seed: one row per seed. */
static void paper_setting(int m, int count)
{
    double sp[64], gap[64], cpu_opt[64];
    int rows = 0;
    printf("\n## 160-layer BERT, 64 devices, 4 sites, %d micro-batches of 8 x 128 (seeds %llu-%llu)\n",
           m, (unsigned long long)g_seed, (unsigned long long)g_seed + (uint64_t)count - 1);
    printf("| seed | even (s) | sky (s) | optimal (s) | stages | speed-up vs even | lower bound (s) | "
           "certified gap | planning CPU ms |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    uint64_t first = g_seed;
    for (int k = 0; k < count; k++, g_seed++) {
        setting s = {160, 1024, 16, 4096, 30522, 128, 8, 64, 4, 6.0, 2.0, 1.0, 20, 80, 10.0, 100};
        double F, it[3], cpu[3];
        int st[3], ok = 1;
        bal_problem *pb = build(&s, &F);
        bal_opts o = bal_opts_default();
        o.micro_batches = m;
        for (int a = 0; a < 2; a++)
            ok &= plan_once(pb, a, &o, &it[a], &st[a], &cpu[a]) == 0;
        /* optimal's CPU: the median of three runs (the same plan each time) */
        ok &= measure(pb, BAL_OPTIMAL, &o, 3, &cpu[2], &it[2], &st[2]) == 0;
        double lb = bal_lower_bound(pb, m, -1);
        bal_problem_free(pb);
        if (!ok)
            continue;
        sp[rows] = it[0] / it[2];
        gap[rows] = it[2] / lb - 1;
        cpu_opt[rows++] = cpu[2];
        printf("| %llu | %.3f | %.3f | %.3f | %d | %.2fx | %.3f | %.1f%% | %.1f |\n",
               (unsigned long long)g_seed, it[0], it[1], it[2], st[2], it[0] / it[2], lb,
               100 * (it[2] / lb - 1), 1e3 * cpu[2]);
    }
    g_seed = first;
    if (!rows)
        return;
    qsort(sp, (size_t)rows, sizeof(double), cmp_double);
    qsort(gap, (size_t)rows, sizeof(double), cmp_double);
    qsort(cpu_opt, (size_t)rows, sizeof(double), cmp_double);
    printf("speed-up of optimal over even: median %.3fx, worst %.3fx; certified gap: median %.1f%%, "
           "worst %.1f%%; planning CPU: median %.1f ms, most %.1f ms\n", bench_median(sp, rows),
           sp[0], 100 * bench_median(gap, rows), 100 * gap[rows - 1],
           1e3 * bench_median(cpu_opt, rows), 1e3 * cpu_opt[rows - 1]);
}

/* Seconds device d needs for the whole model (one micro-batch, fwd + bwd). */
static double floor_time(const bal_problem *pb, int d)
{
    double t = 0;
    for (int u = 0; u < bal_problem_n_units(pb); u++)
        t += bal_unit_fwd_s(pb, d, u) + bal_unit_bwd_s(pb, d, u);
    return t;
}

/* Every subset of the devices in every order (with a data owner: the owner
 * first and last around every sequence of the others, or alone), each placed
 * exactly under the three schedules optimal may pick (textbook 1F1B, and a
 * lookahead sized at the chain's speed floor or at its textbook cycle),
 * judged by the simulator. */
static double exhaustive(const bal_problem *pb, int D, int m, int owner, long *chains)
{
    double best = INFINITY;
    int seq[8], used[8] = {0};
    *chains = 0;
    /* iterative DFS over sequences without repetition; depth 0 = the empty one */
    int depth = 0, next[9] = {0};
    for (;;) {
        int L = depth, order[10], cuts[11], extra[10], p = 0;
        if (owner >= 0)
            order[p++] = owner;
        for (int i = 0; i < L; i++)
            order[p++] = seq[i];
        if (owner >= 0 && L > 0)
            order[p++] = owner;
        if (p > 0 && !(owner < 0 && L == 0) && p <= bal_problem_n_units(pb)) {
            (*chains)++;
            bal_chain ch = {p, order, extra, m, BAL_1F1B, 1, owner >= 0 && p >= 3};
            double inv = 0;
            for (int i = 0; i < p - (owner >= 0 && p >= 3); i++)
                inv += 1 / floor_time(pb, order[i]);
            double refs[3] = {0, 1 / inv, 0};
            for (int v = 0; v < 3; v++) {
                bal_chain_lookahead(pb, order, p, refs[v], m, extra);
                double cyc = bal_chain_best(pb, &ch, cuts);
                if (v == 0)
                    refs[2] = cyc;
                if (!(cyc < INFINITY))
                    continue;
                bal_plan *pl = bal_plan_chain(pb, &ch, cuts, NULL);
                bal_timeline *tl = pl ? bal_simulate(pl, BAL_1F1B, 0, NULL) : NULL;
                if (tl && tl->iteration_s < best)
                    best = tl->iteration_s;
                bal_timeline_free(tl);
                bal_plan_free(pl);
            }
        }
        /* the next sequence */
        for (;;) {
            if (depth < D && next[depth] < D) {
                int d = next[depth]++;
                if (used[d] || d == owner)
                    continue;
                seq[depth] = d;
                used[d] = 1;
                depth++;
                next[depth] = 0;
                break;
            }
            if (depth == 0)
                return best;
            depth--;
            used[seq[depth]] = 0;
        }
    }
}

static void small_exhaustive(int count, int maxdev)
{
    printf("\n## optimal vs exhaustive subset x order search (24-layer BERT-large, seq 128, "
           "micro-batch 8, 32 micro-batches)\n");
    printf("| devices | sites | data owner | chains searched | exhaustive (s) | optimal (s) | "
           "optimal / exhaustive | sky / exhaustive | even / exhaustive | certified gap | "
           "optimal planning CPU ms |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    double worst = 0;
    for (int k = 0; k < count; k++) {
        int D = maxdev - (k / 2 % 3), owner = k % 2 ? 0 : -1;
        setting s = {24, 1024, 16, 4096, 30522, 128, 8, D, 2 + k / 2 % 2, 6.0, 2.0, 1.0, 20, 80,
                     10.0, 200 + 10 * (uint64_t)(k / 2)};
        double F;
        bal_problem *pb = build(&s, &F);
        bal_opts o = bal_opts_default();
        o.micro_batches = 32;
        o.data_owner = owner;
        long chains;
        double ex = exhaustive(pb, D, 32, owner, &chains);
        double t[3], pt = NAN;
        for (int a = 0; a < 3; a++) {
            int st;
            if (measure(pb, a, &o, 1, a == BAL_OPTIMAL ? &pt : &t[a], &t[a], &st))
                t[a] = NAN;
        }
        if (t[2] / ex > worst)
            worst = t[2] / ex;
        double lb = bal_lower_bound(pb, 32, owner);
        printf("| %d | %d | %s | %ld | %.4f | %.4f | %.4f | %.3f | %.3f | %.1f%% | %.0f |\n", D,
               s.n_sites, owner >= 0 ? bal_problem_device(pb, owner)->id : "-", chains, ex, t[2],
               t[2] / ex, t[1] / ex, t[0] / ex, 100 * (t[2] / lb - 1), 1e3 * pt);
        bal_problem_free(pb);
    }
    printf("worst optimal / exhaustive: %.4f\n", worst);
}

/* 12 devices: the exact search over every subset and order, and optimal. */
static void exact12(void)
{
    printf("\n## 12 devices over 3 sites: the exact subset x order search (bal_exact_best) and "
           "optimal\n");
    printf("| layers | data owner | micro-batches | exact cycle (ms) | exact CPU ms | optimal "
           "cycle (ms) | optimal iteration (s) | certified gap | optimal planning CPU ms |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    static const int layers[2] = {24, 160}, mb[2] = {32, 128};
    for (int l = 0; l < 2; l++)
        for (int owner = -1; owner <= 0; owner++) {
            setting s = {layers[l], 1024, 16, 4096, 30522, 128, 8, 12, 3, 6.0, 2.0, 1.0, 20, 80,
                         10.0, 400};
            double F;
            bal_problem *pb = build(&s, &F);
            int order[16], cuts[17], p;
            double t0 = cpu_s();
            double cyc = bal_exact_best(pb, mb[l], BAL_1F1B, owner, order, cuts, &p);
            double ex_s = cpu_s() - t0;
            bal_opts o = bal_opts_default();
            o.micro_batches = mb[l];
            o.data_owner = owner;
            sl_err err = {0};
            t0 = cpu_s();
            bal_plan *pl = bal_plan_make(pb, BAL_OPTIMAL, &o, &err);
            double pl_s = cpu_s() - t0;
            bal_timeline *tl = pl ? bal_simulate(pl, BAL_1F1B, 0, &err) : NULL;
            if (tl)
                printf("| %d | %s | %d | %.2f | %.0f | %.2f | %.4f | %.1f%% | %.0f |\n", layers[l],
                       owner >= 0 ? bal_problem_device(pb, owner)->id : "-", mb[l], 1e3 * cyc,
                       1e3 * ex_s, 1e3 * pl->cycle_s, tl->iteration_s,
                       100 * (tl->iteration_s / bal_lower_bound(pb, mb[l], owner) - 1), 1e3 * pl_s);
            bal_timeline_free(tl);
            bal_plan_free(pl);
            bal_problem_free(pb);
        }
}

static void large(int reps)
{
    setting s = {1000, 1024, 16, 4096, 30522, 128, 8, 1024, 8, 6.0, 2.0, 1.0, 20, 80, 10.0, 300};
    double F;
    bal_problem *pb = build(&s, &F);
    bal_opts o = bal_opts_default();
    o.micro_batches = 128;
    printf("\n## planning time, 1,000-layer BERT on 1,024 devices over 8 sites, 128 micro-batches\n");
    printf("| algo | stages | planning CPU s (median of %d) | simulated iteration (s) |\n", reps);
    printf("|---|---|---|---|\n");
    double best = INFINITY;
    for (int a = 0; a < 3; a++) {
        double pt, it;
        int st;
        if (!measure(pb, a, &o, reps, &pt, &it, &st)) {
            printf("| %s | %d | %.3f | %.3f |\n", bal_algo_name(a), st, pt, it);
            best = fmin(best, it);
        }
    }
    double t0 = cpu_s(), lb = bal_lower_bound(pb, 128, -1);
    printf("lower bound %.3f s (certified gap of the best plan %.1f%%), computed in %.3f s of CPU\n",
           lb, 100 * (best / lb - 1), cpu_s() - t0);
    bal_problem_free(pb);
}

/* Federation: R data owners, a replica around each, over 12 devices in 3
 * sites; the placement (bal_fed_place) against an equal share of the other
 * devices per owner (bal_fed_even), both planned per replica with
 * `optimal`, U-shaped. The slowest replica sets a synchronised job's pace. */
static void federation(int count)
{
    printf("\n## federation: replicas placed against an equal share (24-layer BERT-large, 12 devices "
           "over 3 sites, speeds 1-6x, 64 micro-batches)\n");
    printf("| owners | seeds | slowest replica, equal share / placed: median | worst | best | "
           "placement CPU s (median) |\n|---|---|---|---|---|---|\n");
    for (int R = 2; R <= 3; R++) {
        double *ratio = sl_xcalloc((size_t)count, sizeof *ratio), *cpu = sl_xcalloc((size_t)count, sizeof *cpu);
        int n = 0;
        for (int i = 0; i < count; i++) {
            setting s = {24, 1024, 16, 4096, 30522, 128, 8, 12, 3, 6.0, 10.0, 1.0, 20, 80, 10.0,
                         (uint64_t)(500 + 10 * i)};
            double F;
            bal_problem *pb = build(&s, &F);
            const bal_problem *pbs[3] = {pb, pb, pb};
            int owner[3] = {0, 4, 8}; /* one per site (devices are listed site by site) */
            bal_fed_in fi = {.R = R, .pb = pbs, .owner = owner, .opts = bal_opts_default(),
                             .ushaped = 1, .algo = BAL_OPTIMAL};
            fi.opts.micro_batches = 64;
            sl_err err = {0};
            double t0 = cpu_s();
            bal_fed *f = bal_fed_place(&fi, &err);
            double t1 = cpu_s();
            bal_fed *e = bal_fed_even(&fi, &err);
            if (f && e) {
                ratio[n] = e->slowest_s / f->slowest_s;
                cpu[n++] = t1 - t0;
            }
            bal_fed_free(f);
            bal_fed_free(e);
            bal_problem_free(pb);
        }
        qsort(ratio, (size_t)n, sizeof *ratio, cmp_double);
        qsort(cpu, (size_t)n, sizeof *cpu, cmp_double);
        if (n)
            printf("| %d | %d | %.2fx | %.2fx | %.2fx | %.2f |\n", R, n, ratio[n / 2], ratio[0],
                   ratio[n - 1], cpu[n / 2]);
        free(ratio);
        free(cpu);
    }
}

int main(int argc, char **argv)
{
    int quick = 0, paper_only = 0, fed_only = 0, seeds = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--paper"))
            paper_only = 1;
        else if (!strcmp(argv[i], "--fed"))
            fed_only = 1;
        else if (!strcmp(argv[i], "--seeds") && i + 1 < argc)
            seeds = atoi(argv[++i]);
        else
            g_seed = strtoull(argv[i], NULL, 10);
    }
    if (seeds < 1 || seeds > 64) {
        fprintf(stderr, "bench_balancer: --seeds takes 1 to 64\n");
        return 2;
    }
    if (fed_only) {
        federation(quick ? 2 : seeds);
        return 0;
    }
    paper_setting(128, quick ? 2 : seeds);
    paper_setting(256, quick ? 2 : seeds);
    if (paper_only)
        return 0;
    small_exhaustive(quick ? 2 : 12, 8);
    exact12();
    large(quick ? 1 : 3);
    federation(quick ? 2 : seeds);
    return 0;
}
