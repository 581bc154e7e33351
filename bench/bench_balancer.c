/* The balancer on the Sky Computing setting and beyond. Prints tables for
 * docs/balancer.md; asserts nothing about time.
 *
 *   1. 160-layer BERT (H 1024, 16 heads, I 4096, seq 128, micro-batch 8),
 *      64 devices over 4 sites: even / sky / optimal, simulated iteration,
 *      speed-up, gap to the lower bound, planning time.
 *   2. <= 8 devices: optimal vs the exhaustive search over every subset and
 *      order (each placed exactly), judged by the simulator.
 *   3. planning time at 1,024 devices x 1,000 layers.
 * Usage: bench_balancer [seed] [--quick] */
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "bal.h"
#include "sl_mem.h"
#include "sl_rng.h"

static uint64_t g_seed = 42;

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

static void paper_setting(int m, int reps)
{
    setting s = {160, 1024, 16, 4096, 30522, 128, 8, 64, 4, 6.0, 2.0, 1.0, 20, 80, 10.0, 100};
    double F;
    bal_problem *pb = build(&s, &F);
    double work = 0;
    for (int u = 0; u < bal_problem_n_units(pb); u++)
        work += bal_problem_unit(pb, u)->fwd_flops + bal_problem_unit(pb, u)->bwd_flops;
    double lb = m * work / F;
    bal_opts o = bal_opts_default();
    o.micro_batches = m;
    printf("\n## 160-layer BERT, 64 devices, 4 sites, %d micro-batches of 8 x 128 (seed %llu)\n",
           m, (unsigned long long)g_seed);
    printf("lower bound = m x sum(fwd+bwd FLOPs of all units) / sum(device FLOP/s) = %.3f s\n", lb);
    printf("| algo | stages | iteration (s) | speed-up vs even | gap to bound | planning CPU ms (median of %d) |\n", reps);
    printf("|---|---|---|---|---|---|\n");
    double even = NAN;
    for (int a = 0; a < 3; a++) {
        double pt, it;
        int st;
        if (measure(pb, a, &o, reps, &pt, &it, &st))
            continue;
        if (a == BAL_EVEN)
            even = it;
        printf("| %s | %d | %.3f | %.2fx | %.1f%% | %.2f |\n", bal_algo_name(a), st, it,
               even / it, 100 * (it / lb - 1), 1e3 * pt);
    }
    bal_problem_free(pb);
}

/* Seconds device d needs for the whole model (one micro-batch, fwd + bwd). */
static double floor_time(const bal_problem *pb, int d)
{
    double t = 0;
    for (int u = 0; u < bal_problem_n_units(pb); u++)
        t += bal_unit_fwd_s(pb, d, u) + bal_unit_bwd_s(pb, d, u);
    return t;
}

static int g_best_order[8], g_best_p, g_best_variant; /* the exhaustive winner */

/* Every nonempty subset in every order, each placed exactly, simulated. */
static double exhaustive(const bal_problem *pb, int D, int m, long *chains)
{
    double best = INFINITY;
    int order[8], cuts[9], used[8] = {0};
    *chains = 0;
    /* iterative DFS over sequences without repetition */
    int depth = 0, next[9] = {0};
    for (;;) {
        if (next[depth] >= D) {
            if (depth == 0)
                break;
            depth--;
            used[order[depth]] = 0;
            next[depth]++;
            continue;
        }
        int d = next[depth];
        if (used[d]) {
            next[depth]++;
            continue;
        }
        order[depth] = d;
        used[d] = 1;
        int p = depth + 1;
        (*chains)++;
        /* the same placements optimal can make: textbook 1F1B, and a lookahead
         * sized at the chain's speed floor or at its textbook cycle */
        int extra[8], cuts2[9];
        bal_chain ch = {p, order, extra, m, BAL_1F1B, 1, 0};
        double inv = 0;
        for (int i = 0; i < p; i++)
            inv += 1 / floor_time(pb, order[i]);
        double refs[3] = {0, 1 / inv, 0};
        for (int v = 0; v < 3; v++) {
            bal_chain_lookahead(pb, order, p, refs[v], m, extra);
            double cyc = bal_chain_best(pb, &ch, cuts);
            if (v == 0)
                refs[2] = cyc;
            if (!(cyc < INFINITY))
                continue;
            memcpy(cuts2, cuts, sizeof cuts2);
            sl_err err = {0};
            bal_plan *pl = bal_plan_chain(pb, &ch, cuts2, &err);
            bal_timeline *tl = pl ? bal_simulate(pl, BAL_1F1B, 0, &err) : NULL;
            if (tl && tl->iteration_s < best) {
                best = tl->iteration_s;
                g_best_p = p;
                g_best_variant = v;
                memcpy(g_best_order, order, sizeof order);
            }
            bal_timeline_free(tl);
            bal_plan_free(pl);
        }
        if (depth + 1 < D) {
            depth++;
            next[depth] = 0;
        } else {
            used[d] = 0;
            next[depth]++;
        }
    }
    return best;
}

static void small_exhaustive(int count, int maxdev)
{
    printf("\n## optimal vs exhaustive subset x order search (24-layer BERT-large, seq 128, "
           "micro-batch 8, 32 micro-batches)\n");
    printf("| devices | sites | chains searched | exhaustive (s) | optimal (s) | optimal / exhaustive | sky / exhaustive | even / exhaustive | optimal planning CPU ms |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    double worst = 0;
    for (int k = 0; k < count; k++) {
        int D = maxdev - (k % 3);
        setting s = {24, 1024, 16, 4096, 30522, 128, 8, D, 2 + k % 2, 6.0, 2.0, 1.0, 20, 80,
                     10.0, 200 + 10 * (uint64_t)k};
        double F;
        bal_problem *pb = build(&s, &F);
        bal_opts o = bal_opts_default();
        o.micro_batches = 32;
        long chains;
        double ex = exhaustive(pb, D, 32, &chains);
        double t[3], pt = NAN;
        for (int a = 0; a < 3; a++) {
            int st;
            if (measure(pb, a, &o, 1, a == BAL_OPTIMAL ? &pt : &t[a], &t[a], &st))
                t[a] = NAN;
        }
        if (t[2] / ex > worst)
            worst = t[2] / ex;
        printf("| %d | %d | %ld | %.4f | %.4f | %.4f | %.3f | %.3f | %.0f |\n", D, s.n_sites,
               chains, ex, t[2], t[2] / ex, t[1] / ex, t[0] / ex, 1e3 * pt);
        bal_problem_free(pb);
    }
    printf("worst optimal / exhaustive: %.4f\n", worst);
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
    for (int a = 0; a < 3; a++) {
        double pt, it;
        int st;
        if (!measure(pb, a, &o, reps, &pt, &it, &st))
            printf("| %s | %d | %.3f | %.3f |\n", bal_algo_name(a), st, pt, it);
    }
    bal_problem_free(pb);
}

int main(int argc, char **argv)
{
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else
            g_seed = strtoull(argv[i], NULL, 10);
    }
    paper_setting(128, quick ? 1 : 5);
    paper_setting(256, quick ? 1 : 5);
    small_exhaustive(quick ? 2 : 9, 8);
    large(quick ? 1 : 3);
    return 0;
}
