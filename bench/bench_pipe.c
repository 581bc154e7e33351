/* bench_pipe: the pipeline on one machine against the simulator.
 *
 * Config (b) (L4 H256 A4 F1024 V8192), seq 128, batch 32, 8 micro-batches of
 * 4: one stage on 2 threads against 2 stages of 1 thread each (the
 * in-process port, 1F1B), in alternating rounds. The cut is the balancer's
 * best for two equal devices given the per-unit times measured here on one
 * thread (dev_unit_times, the profile a device reports), and the simulator's
 * iteration time for that cut is the prediction the measured step is held
 * against. Prints one JSON line per run and a summary line. */
#include <omp.h>
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

enum { B = 32, T = 128, M = 8 };

static const dev_config cfg = {.hidden = 256, .layers = 4, .heads = 4, .intermediate = 1024,
                               .vocab = 8192, .max_pos = 512, .type_vocab = 2, .ln_eps = 1e-12f,
                               .gelu = 0, .hidden_dropout = 0.1f, .attn_dropout = 0.1f,
                               .init_range = 0.02f};

/* Median seconds per step of `steps` steps after one warm-up. */
static double run(dev_train *tr, const dev_batch *b, int steps)
{
    dev_optim o;
    dev_optim_default(&o);
    dev_step_info info;
    sl_err err = {0};
    double *dt = sl_xmalloc((size_t)steps * sizeof *dt);
    for (int s = -1; s < steps; s++) {
        double t0 = sl_now_s();
        if (dev_train_step(tr, b, &o, &info, &err)) {
            fprintf(stderr, "bench_pipe: %s\n", err.msg);
            exit(1);
        }
        if (s >= 0)
            dt[s] = sl_now_s() - t0;
    }
    double med = bench_median(dt, steps);
    free(dt);
    return med;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 5, rounds = argc > 2 ? atoi(argv[2]) : 3;
    if (steps < 1 || rounds < 1) {
        fprintf(stderr, "usage: bench_pipe [steps] [rounds]\n");
        return 2;
    }
    int U = dev_unit_count(&cfg);
    sl_err err = {0};
    /* the profile: per-unit seconds on one thread, micro-batch B/M */
    double *fwd = sl_xcalloc((size_t)U, sizeof *fwd), *bwd = sl_xcalloc((size_t)U, sizeof *bwd);
    omp_set_num_threads(1);
    kn_blas_set_threads(1);
    if (dev_unit_times(&cfg, B / M, T, NULL, 7, fwd, bwd, &err)) {
        fprintf(stderr, "bench_pipe: %s\n", err.msg);
        return 1;
    }
    bal_bert bb = {.hidden = cfg.hidden, .layers = cfg.layers, .heads = cfg.heads,
                   .intermediate = cfg.intermediate, .vocab = cfg.vocab, .max_pos = cfg.max_pos,
                   .type_vocab = cfg.type_vocab};
    bal_unit *units = NULL;
    int nu = 0;
    if (bal_bert_units(&bb, B / M, T, &units, &nu, &err)) {
        fprintf(stderr, "bench_pipe: %s\n", err.msg);
        return 1;
    }
    bal_device dv[2];
    memset(dv, 0, sizeof dv);
    for (int d = 0; d < 2; d++) {
        snprintf(dv[d].id, sizeof dv[d].id, "thread%d", d);
        snprintf(dv[d].site, sizeof dv[d].site, "here");
        snprintf(dv[d].host, sizeof dv[d].host, "this");
        snprintf(dv[d].backend, sizeof dv[d].backend, "cpu");
        dv[d].mem_bytes = 8ull << 30;
        dv[d].flops = 5e10;
        dv[d].unit_fwd_s = fwd;
        dv[d].unit_bwd_s = bwd;
    }
    bal_network net = bal_network_default();
    net.same_host = (bal_link){.bw = 10e9, .lat = 5e-6}; /* a memcpy between threads */
    bal_problem *pb = bal_problem_new(units, nu, dv, 2, &net, &err);
    int order[2] = {0, 1}, cuts[3];
    bal_chain ch = {.p = 2, .order = order, .extra = NULL, .m = M, .schedule = BAL_1F1B,
                    .window = 1};
    bal_plan *pl = NULL;
    bal_timeline *tl = NULL;
    if (!pb || bal_chain_best(pb, &ch, cuts) >= 1e300 ||
        !(pl = bal_plan_chain(pb, &ch, cuts, &err)) || !(tl = bal_simulate(pl, BAL_1F1B, 0, &err))) {
        fprintf(stderr, "bench_pipe: planning: %s\n", err.msg);
        return 1;
    }
    double predicted = tl->iteration_s;
    double unit_sum = 0;
    for (int u = 0; u < U; u++)
        unit_sum += fwd[u] + bwd[u];
    printf("{\"profile\": {\"micro_batch\": %d, \"fwd_s\": [", B / M);
    for (int u = 0; u < U; u++)
        printf("%s%.5f", u ? ", " : "", fwd[u]);
    printf("], \"bwd_s\": [");
    for (int u = 0; u < U; u++)
        printf("%s%.5f", u ? ", " : "", bwd[u]);
    printf("]}, \"cut\": \"0-%d,%d-%d\", \"predicted_step_s\": %.4f, "
           "\"predicted_one_thread_s\": %.4f}\n",
           cuts[1] - 1, cuts[1], U - 1, predicted, unit_sum * M);

    int one[2] = {0, U}, two[3] = {0, cuts[1], U};
    dev_train_opts o1 = {.schedule = BAL_1F1B}, o2 = {.schedule = BAL_1F1B, .stage_threads = 1};
    dev_train *single = dev_train_open(&cfg, one, 1, B, T, M, 1, &o1, &err);
    dev_train *pipe = single ? dev_train_open(&cfg, two, 2, B, T, M, 1, &o2, &err) : NULL;
    if (!pipe) {
        fprintf(stderr, "bench_pipe: %s\n", err.msg);
        return 1;
    }
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
    double *ts = sl_xmalloc((size_t)rounds * 2 * sizeof *ts), *tp = ts + rounds;
    for (int r = 0; r < rounds; r++) {
        omp_set_num_threads(2);
        kn_blas_set_threads(2);
        ts[r] = run(single, &b, steps);
        tp[r] = run(pipe, &b, steps);
        printf("{\"round\": %d, \"one_stage_2_threads_s\": %.4f, \"two_stages_1_thread_s\": %.4f}\n",
               r, ts[r], tp[r]);
        fflush(stdout);
    }
    double ms = bench_median(ts, rounds), mp = bench_median(tp, rounds);
    printf("{\"summary\": true, \"config\": \"b\", \"batch\": %d, \"micro_batches\": %d, "
           "\"one_stage_tokens_per_s\": %.1f, \"two_stages_tokens_per_s\": %.1f, "
           "\"pipe_over_one_stage\": %.3f, \"predicted_step_s\": %.4f, \"measured_step_s\": %.4f, "
           "\"measured_over_predicted\": %.3f}\n",
           B, M, (double)n / ms, (double)n / mp, ms / mp, predicted, mp, mp / predicted);
    dev_train_free(single);
    dev_train_free(pipe);
    bal_timeline_free(tl);
    bal_plan_free(pl);
    bal_problem_free(pb);
    free(units);
    free(fwd);
    free(bwd);
    free(ts);
    free(tok);
    free(seg);
    free(valid);
    free(lab);
    return 0;
}
