/* The stage runner (dev_pipe) and the in-process port: every stage runs
 * exactly the ops bal_stage_ops lists (the order the simulator replays), for
 * 1F1B and GPipe, up to 16 stages and 64 micro-batches; a stage that fails
 * stops the others with its own error (nobody waits forever), and the
 * trainer runs the next step after that. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal.h"
#include "dev_testutil.h"
#include "sl_mem.h"
#include "sl_test.h"

/* 14 layers: up to 16 stages of one unit each. */
static const dev_config cfg = {.hidden = 8, .layers = 14, .heads = 2, .intermediate = 16,
                               .vocab = 31, .max_pos = 8, .type_vocab = 2, .ln_eps = 1e-12f,
                               .gelu = 0, .hidden_dropout = 0.1f, .attn_dropout = 0.1f,
                               .init_range = 0.02f};
enum { T = 6, MAXP = 16 };

typedef struct trace {
    bal_op *ops[MAXP];
    int n[MAXP], cap;
} trace;

static void record(void *ud, int stage, int kind, int mb)
{
    trace *t = ud;
    if (t->n[stage] < t->cap)
        t->ops[stage][t->n[stage]] = (bal_op){kind, mb};
    t->n[stage]++;
}

static void even_bounds(int p, int *bounds)
{
    int units = dev_unit_count(&cfg);
    for (int i = 0; i <= p; i++)
        bounds[i] = (int)((long)units * i / p);
}

static void test_order(void)
{
    static const int ps[] = {1, 2, 3, 5, 8, 16}, ms[] = {1, 2, 3, 7, 16, 64};
    int cases = 0, bad = 0;
    for (size_t a = 0; a < sizeof ps / sizeof ps[0]; a++)
        for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++)
            for (int sched = 0; sched < 2; sched++) {
                int p = ps[a], m = ms[k], bounds[MAXP + 1];
                even_bounds(p, bounds);
                sl_err err = {0};
                dev_train_opts o = {.schedule = sched ? BAL_GPIPE : BAL_1F1B, .stage_threads = 1};
                dev_train *tr = dev_train_open(&cfg, bounds, p, m, T, m, 3, &o, &err);
                CHECKF(tr != NULL, "p=%d m=%d: %s", p, m, err.msg);
                if (!tr)
                    continue;
                trace t = {.cap = BAL_STAGE_OPS_MAX(m)};
                for (int i = 0; i < p; i++) {
                    t.ops[i] = sl_xcalloc((size_t)t.cap, sizeof(bal_op));
                    dev_pipe_set_trace(dev_train_pipe(tr, i), record, &t);
                }
                dt_batch b;
                dt_make_batch(&b, m, T, cfg.vocab, 40 + (uint64_t)m);
                dev_batch db = dt_view(&b);
                dev_optim opt;
                dev_optim_default(&opt);
                dev_step_info info;
                CHECKF(dev_train_step(tr, &db, &opt, &info, &err) == 0, "p=%d m=%d: %s", p, m,
                       err.msg);
                bal_op *want = sl_xcalloc((size_t)t.cap, sizeof(bal_op));
                for (int i = 0; i < p; i++) {
                    int n = bal_stage_ops(o.schedule, p, i, m, -1, want);
                    int same = n == t.n[i];
                    for (int j = 0; same && j < n; j++)
                        same = want[j].kind == t.ops[i][j].kind && want[j].mb == t.ops[i][j].mb;
                    bad += !same;
                    CHECKF(same, "p=%d m=%d %s: stage %d ran %d ops, not the %d of bal_stage_ops",
                           p, m, sched ? "gpipe" : "1f1b", i, t.n[i], n);
                    free(t.ops[i]);
                }
                free(want);
                dt_free_batch(&b);
                dev_train_free(tr);
                cases++;
            }
    printf("    %d pipelines, %d stages ran another order\n", cases, bad);
}

/* A token outside the vocabulary fails stage 0's forward of micro-batch 1:
 * the trainer reports that (not the other stages' "stopped"), no thread
 * hangs, and the next step with a good batch runs. */
static void test_failure_stops_all(void)
{
    int bounds[5];
    even_bounds(4, bounds);
    sl_err err = {0};
    dev_train *tr = dev_train_create(&cfg, bounds, 4, 8, T, 4, 3, &err);
    CHECKF(tr != NULL, "%s", err.msg);
    if (!tr)
        return;
    dt_batch b;
    dt_make_batch(&b, 8, T, cfg.vocab, 5);
    b.tok[2 * T + 1] = cfg.vocab + 3; /* sequence 2: micro-batch 1 */
    dev_batch db = dt_view(&b);
    dev_optim opt;
    dev_optim_default(&opt);
    dev_step_info info;
    CHECK(dev_train_step(tr, &db, &opt, &info, &err) == -1);
    printf("    error: %s\n", err.msg);
    CHECK(err.code == SL_EINVAL && strstr(err.msg, "stage 0") && strstr(err.msg, "outside the vocabulary"));
    b.tok[2 * T + 1] = 7;
    CHECKF(dev_train_step(tr, &db, &opt, &info, &err) == 0, "%s", err.msg);
    CHECK(info.masked > 0 && info.loss > 0);
    dt_free_batch(&b);
    dev_train_free(tr);
}

/* Each stage records its step as segments: bal_stage_ops's ops in their
 * order, then the labels (first and last stage), the sync and the
 * optimizer; one after the other inside the step, adding up to the step's
 * forward and backward times. */
static void test_segments(void)
{
    enum { P = 3, M = 4 };
    int bounds[P + 1];
    even_bounds(P, bounds);
    sl_err err = {0};
    dev_train_opts o = {.schedule = BAL_1F1B, .stage_threads = 1};
    dev_train *tr = dev_train_open(&cfg, bounds, P, M, T, M, 3, &o, &err);
    CHECKF(tr != NULL, "%s", err.msg);
    if (!tr)
        return;
    dt_batch b;
    dt_make_batch(&b, M, T, cfg.vocab, 9);
    dev_batch db = dt_view(&b);
    dev_optim opt;
    dev_optim_default(&opt);
    dev_step_info info;
    bal_op want[BAL_STAGE_OPS_MAX(M)];
    for (int step = 0; step < 2; step++) {
        CHECKF(dev_train_step(tr, &db, &opt, &info, &err) == 0, "%s", err.msg);
        for (int i = 0; i < P; i++) {
            dev_pipe *pp = dev_train_pipe(tr, i);
            const dev_pipe_seg *s;
            int n = dev_pipe_segments(pp, &s), nops = bal_stage_ops(BAL_1F1B, P, i, M, -1, want);
            dev_pipe_times t;
            dev_pipe_times_get(pp, &t);
            int k = 0, ok = 1;
            if (i == 0 || i == P - 1)
                ok &= n > 0 && s[k++].kind == (i == 0 ? DEV_SEG_SEND_LABELS : DEV_SEG_RECV_LABELS);
            for (int j = 0; ok && j < nops; j++, k++)
                ok &= k < n && s[k].kind == want[j].kind && s[k].mb == want[j].mb;
            ok &= k + 2 == n && s[k].kind == DEV_SEG_SYNC && s[k + 1].kind == DEV_SEG_OPTIM &&
                  s[k].mb == -1;
            CHECKF(ok, "step %d stage %d: %d segments, not labels + %d ops + sync + optimizer",
                   step, i, n, nops);
            double fwd = 0, bwd = 0;
            for (int j = 0; j < n; j++) {
                CHECKF(s[j].start >= 0 && s[j].end >= s[j].start && s[j].end <= t.step_s + 1e-3 &&
                       (j == 0 || s[j].start >= s[j - 1].end - 1e-9),
                       "stage %d segment %d: %.6f-%.6f in a step of %.6f s", i, j, s[j].start,
                       s[j].end, t.step_s);
                fwd += s[j].kind == DEV_SEG_FWD ? s[j].end - s[j].start : 0;
                bwd += s[j].kind == DEV_SEG_BWD ? s[j].end - s[j].start : 0;
            }
            CHECKF(fabs(fwd - t.fwd_s) <= 1e-4 + 0.01 * t.fwd_s &&
                   fabs(bwd - t.bwd_s) <= 1e-4 + 0.01 * t.bwd_s,
                   "stage %d: segments add to %.6f/%.6f s, the times say %.6f/%.6f", i, fwd, bwd,
                   t.fwd_s, t.bwd_s);
        }
    }
    dt_free_batch(&b);
    dev_train_free(tr);
}

/* A runner refuses a stage that does not fit its place in the chain. */
static void test_runner_checks(void)
{
    sl_err err = {0};
    dev_stage *mid = dev_stage_create(&cfg, 3, 5, 2, T, 2, 1, NULL, 0, &err);
    CHECKF(mid != NULL, "%s", err.msg);
    dev_pipe_cfg pc = {.stages = 3, .index = 0, .schedule = BAL_1F1B, .warmup = -1, .B = 4,
                       .T = T, .micro = 2, .seed = 1};
    dev_port_hub_cfg hc = {.stages = 3, .depth = 2, .act_floats = 64, .valid_ints = 16,
                           .label_ints = 32, .tied_floats = 0, .gather_max = 8};
    dev_port_hub *h = dev_port_hub_create(&hc, &err);
    CHECK(h != NULL);
    CHECK(dev_pipe_create(mid, &pc, dev_port_hub_port(h, 0), &err) == NULL &&
          strstr(err.msg, "unit 0"));
    pc.index = 1;
    CHECK(dev_pipe_create(mid, &pc, NULL, &err) == NULL && strstr(err.msg, "needs a port"));
    CHECK(dev_pipe_create(mid, &pc, dev_port_hub_port(h, 2), &err) == NULL &&
          strstr(err.msg, "the port is stage 2"));
    pc.B = 5;
    CHECK(dev_pipe_create(mid, &pc, dev_port_hub_port(h, 1), &err) == NULL &&
          strstr(err.msg, "multiple"));
    dev_port_hub_free(h);
    dev_stage_free(mid);
}

int main(void)
{
    RUN(test_order);
    RUN(test_failure_stops_all);
    RUN(test_segments);
    RUN(test_runner_checks);
    return sl_test_done();
}
