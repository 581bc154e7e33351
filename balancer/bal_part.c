/* bal_part.c - the objective of a chain, its exact minimum over cut points,
 * the two baselines (even, sky) and turning cuts into a plan.
 *
 * The exact partition: for a bound B, g_i(s) is the smallest round trip
 * (stage times plus link latency and serialization both ways) of stages
 * i..p-1 covering units [s, n) with every stage within B, its memory and, for
 * 1F1B, its window (g_i(s) <= (p-i) B). Every constraint is an upper bound,
 * so the smallest suffix is always the best one to extend, which makes the
 * recurrence exact:
 *   g_i(s) = min over e of  t_i(s,e) + link_i(e) + g_{i+1}(e).
 * Feasibility of [s,e) is hereditary (a sub-range of a feasible range is
 * feasible), so the admissible e form a window whose ends only grow with s;
 * a monotone deque gives each stage in O(n). Feasibility is monotone in B,
 * and the minimum is one of finitely many values, so bisection on B, each
 * step tightened to the cycle actually achieved, finds it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal_int.h"
#include "sl_mem.h"
#include "sl_time.h"

const char *bal_algo_name(int a)
{
    return a == BAL_EVEN ? "even" : a == BAL_SKY ? "sky" : a == BAL_OPTIMAL ? "optimal" : "?";
}

int bal_algo_parse(const char *s)
{
    for (int a = 0; a < 3; a++)
        if (!strcmp(s, bal_algo_name(a)))
            return a;
    return -1;
}

const char *bal_schedule_name(int s) { return s == BAL_GPIPE ? "gpipe" : "1f1b"; }

int bal_schedule_parse(const char *s)
{
    if (!strcmp(s, "1f1b"))
        return BAL_1F1B;
    if (!strcmp(s, "gpipe"))
        return BAL_GPIPE;
    return -1;
}

bal_opts bal_opts_default(void)
{
    bal_opts o = {.schedule = BAL_1F1B, .micro_batches = 0, .max_micro_batches = 1024,
                  .target_bubble = 0.10, .window = 1};
    return o;
}

/* Per-direction serialization of the boundary at cut e between two devices. */
static void link_cost(const bal_problem *pb, int a, int b, int e, double *lat2, double *ser2,
                      double *ser_max)
{
    bal_link f = bal_problem_link(pb, a, b), r = bal_problem_link(pb, b, a);
    double sf = bal_ser(pb, f, e), sr = bal_ser(pb, r, e);
    *lat2 = f.lat + r.lat;
    *ser2 = sf + sr;
    *ser_max = sf > sr ? sf : sr;
}

double bal_chain_cycle(const bal_problem *pb, const int *order, int p, const int *cuts, int m,
                       int schedule, int window)
{
    double cyc = 0, R = 0;
    for (int i = p - 1; i >= 0; i--) {
        int d = order[i];
        if (!bal_fits(pb, d, cuts[i], cuts[i + 1], bal_inflight(schedule, i, p, m)))
            return INFINITY;
        double t = bal_time(pb, d, cuts[i], cuts[i + 1]);
        R += t;
        if (t > cyc)
            cyc = t;
        if (i < p - 1) {
            double lat2, ser2, smax;
            link_cost(pb, d, order[i + 1], cuts[i + 1], &lat2, &ser2, &smax);
            R += lat2 + ser2;
            if (smax > cyc)
                cyc = smax;
        }
        if (window && schedule == BAL_1F1B && R / (p - i) > cyc)
            cyc = R / (p - i);
    }
    return cyc;
}

typedef struct dp_ws {
    double *g, *gn, *v;
    int *nxt, *dq;
} dp_ws;

/* One feasibility test at bound B; on success fills cuts. */
static int dp_feasible(const bal_problem *pb, const int *order, int p, int m, int schedule,
                       int window, double B, dp_ws *w, int *cuts)
{
    int n = pb->n_units;
    size_t n1 = (size_t)n + 1;
    double *g = w->g, *gn = w->gn;
    for (int i = p - 1; i >= 0; i--) {
        int d = order[i], k = bal_inflight(schedule, i, p, m);
        int smin = i, smax = i == 0 ? 0 : n - (p - i), emax = n - (p - 1 - i);
        const double *pre = pb->pre + (size_t)d * n1;
        int *nxt = w->nxt + (size_t)i * n1;
        double wB = (window && schedule == BAL_1F1B) ? (p - i) * B : INFINITY;
        if (i == p - 1) {
            for (int s = smin; s <= smax; s++) {
                double t = pre[n] - pre[s];
                g[s] = (t <= B && bal_fits(pb, d, s, n, k)) ? t : INFINITY;
                nxt[s] = n;
            }
        } else {
            /* v(e) for e in [smin+1, emax]: prefix + link both ways + rest */
            int nb = order[i + 1];
            for (int e = smin + 1; e <= emax; e++) {
                double lat2, ser2, smax_l;
                link_cost(pb, d, nb, e, &lat2, &ser2, &smax_l);
                w->v[e] = (smax_l <= B && gn[e] < INFINITY) ? pre[e] + lat2 + ser2 + gn[e]
                                                             : INFINITY;
            }
            int head = 0, tail = 0, eh = smin, push = smin + 1;
            for (int s = smin; s <= smax; s++) {
                if (eh < s)
                    eh = s;
                while (eh + 1 <= emax && pre[eh + 1] - pre[s] <= B && bal_fits(pb, d, s, eh + 1, k))
                    eh++;
                if (push < s + 1)
                    push = s + 1;
                for (; push <= eh; push++) {
                    if (w->v[push] == INFINITY)
                        continue;
                    while (tail > head && w->v[w->dq[tail - 1]] >= w->v[push])
                        tail--;
                    w->dq[tail++] = push;
                }
                while (tail > head && w->dq[head] < s + 1)
                    head++;
                if (tail > head) {
                    int e = w->dq[head];
                    g[s] = w->v[e] - pre[s];
                    nxt[s] = e;
                    if (g[s] > wB)
                        g[s] = INFINITY;
                } else
                    g[s] = INFINITY;
            }
        }
        double *t = g;
        g = gn;
        gn = t;
    }
    /* gn now holds stage 0 */
    if (!(gn[0] < INFINITY))
        return 0;
    cuts[0] = 0;
    for (int i = 0; i < p; i++)
        cuts[i + 1] = w->nxt[(size_t)i * n1 + cuts[i]];
    return 1;
}

double bal_chain_best(const bal_problem *pb, const int *order, int p, int m, int schedule,
                      int window, int *cuts)
{
    int n = pb->n_units;
    if (p < 1 || p > n)
        return INFINITY;
    size_t n1 = (size_t)n + 1;
    dp_ws w;
    w.g = sl_xmalloc(n1 * sizeof(double));
    w.gn = sl_xmalloc(n1 * sizeof(double));
    w.v = sl_xmalloc(n1 * sizeof(double));
    w.dq = sl_xmalloc(n1 * sizeof(int));
    w.nxt = sl_xmalloc((size_t)p * n1 * sizeof(int));
    int *c = sl_xmalloc(((size_t)p + 1) * sizeof(int));
    double hi = INFINITY, lo = 0;
    if (dp_feasible(pb, order, p, m, schedule, window, INFINITY, &w, c)) {
        hi = bal_chain_cycle(pb, order, p, c, m, schedule, window);
        memcpy(cuts, c, ((size_t)p + 1) * sizeof(int));
        for (int it = 0; it < 200 && hi - lo > 1e-10 * hi; it++) {
            double mid = lo > 0 && hi > 4 * lo ? sqrt(lo * hi) : 0.5 * (lo + hi);
            if (dp_feasible(pb, order, p, m, schedule, window, mid, &w, c)) {
                double got = bal_chain_cycle(pb, order, p, c, m, schedule, window);
                if (!(got < hi)) { /* rounding: the bound was met only to the last bit */
                    hi = mid;
                    continue;
                }
                hi = got;
                memcpy(cuts, c, ((size_t)p + 1) * sizeof(int));
            } else
                lo = mid;
        }
        hi = bal_chain_cycle(pb, order, p, cuts, m, schedule, window);
    }
    free(w.g);
    free(w.gn);
    free(w.v);
    free(w.dq);
    free(w.nxt);
    free(c);
    return hi;
}

int bal_plan_overflow(const bal_problem *pb, const int *order, int p, const int *cuts, int m,
                      int schedule)
{
    for (int i = 0; i < p; i++)
        if (!bal_fits(pb, order[i], cuts[i], cuts[i + 1], bal_inflight(schedule, i, p, m)))
            return i;
    return -1;
}

double bal_estimate(const bal_problem *pb, const int *order, int p, const int *cuts, int m,
                    int schedule, double cycle)
{
    (void)schedule; /* fill and drain cost the same round trip under both */
    double R = 0, opt = 0;
    for (int i = 0; i < p; i++) {
        int d = order[i];
        R += bal_time(pb, d, cuts[i], cuts[i + 1]);
        double o = bal_optim_s(pb, d, cuts[i], cuts[i + 1]);
        if (o > opt)
            opt = o;
        if (i < p - 1) {
            double lat2, ser2, smax;
            link_cost(pb, d, order[i + 1], cuts[i + 1], &lat2, &ser2, &smax);
            R += lat2 + ser2;
        }
    }
    return R + (m - 1) * cycle + opt;
}

bal_plan *bal_plan_build(const bal_problem *pb, int algo, const int *order, int p,
                         const int *cuts, int m, int schedule)
{
    bal_plan *pl = sl_xcalloc(1, sizeof *pl);
    pl->algo = algo;
    pl->schedule = schedule;
    pl->micro_batches = m;
    pl->n_units = pb->n_units;
    pl->n_stages = p;
    pl->stage = sl_xcalloc((size_t)p, sizeof *pl->stage);
    unsigned char *used = sl_xcalloc((size_t)pb->n_dev, 1);
    for (int i = 0; i < p; i++) {
        bal_stage *s = &pl->stage[i];
        int d = order[i], a = cuts[i], b = cuts[i + 1];
        used[d] = 1;
        s->device = d;
        memcpy(s->id, pb->dev[d].id, BAL_NAME_MAX);
        memcpy(s->site, pb->dev[d].site, BAL_NAME_MAX);
        s->first = a;
        s->last = b;
        for (int u = a; u < b; u++) {
            s->fwd_s += bal_unit_fwd_s(pb, d, u);
            s->bwd_s += bal_unit_bwd_s(pb, d, u);
        }
        s->optim_s = bal_optim_s(pb, d, a, b);
        s->static_bytes = pb->pstatic[b] - pb->pstatic[a];
        s->stash_bytes = pb->pstash[b] - pb->pstash[a];
        s->mem_bytes = pb->dev[d].mem_bytes;
        s->max_inflight = bal_inflight(schedule, i, p, m);
        if (i < p - 1) {
            bal_link f = bal_problem_link(pb, d, order[i + 1]);
            bal_link r = bal_problem_link(pb, order[i + 1], d);
            s->lat_s = f.lat;
            s->act_s = bal_ser(pb, f, b);
            s->grad_s = bal_ser(pb, r, b);
            /* the gradient travels on the reverse link; its latency is r.lat */
            if (r.lat != f.lat)
                s->lat_s = 0.5 * (f.lat + r.lat);
        }
    }
    pl->n_dropped = 0;
    pl->dropped = sl_xcalloc((size_t)pb->n_dev, sizeof *pl->dropped);
    for (int d = 0; d < pb->n_dev; d++)
        if (!used[d]) {
            bal_dropped *x = &pl->dropped[pl->n_dropped++];
            x->device = d;
            memcpy(x->id, pb->dev[d].id, BAL_NAME_MAX);
            snprintf(x->reason, sizeof x->reason, "not used");
        }
    free(used);
    pl->cycle_s = bal_chain_cycle(pb, order, p, cuts, m, schedule, schedule == BAL_1F1B);
    pl->est_iter_s = bal_estimate(pb, order, p, cuts, m, schedule, pl->cycle_s);
    return pl;
}

void bal_plan_free(bal_plan *pl)
{
    if (!pl)
        return;
    free(pl->stage);
    free(pl->dropped);
    free(pl);
}

static int check_chain(const bal_problem *pb, const int *order, int p, const int *cuts, int m,
                       sl_err *err)
{
    if (p < 1 || p > pb->n_dev || m < 1)
        return sl_err_set(err, SL_EINVAL, "chain: need 1..%d stages and m >= 1", pb->n_dev);
    if (cuts[0] != 0 || cuts[p] != pb->n_units)
        return sl_err_set(err, SL_EINVAL, "chain: cuts must run from 0 to %d", pb->n_units);
    for (int i = 0; i < p; i++) {
        if (order[i] < 0 || order[i] >= pb->n_dev)
            return sl_err_set(err, SL_EINVAL, "chain: device %d out of range", order[i]);
        if (cuts[i + 1] <= cuts[i])
            return sl_err_set(err, SL_EINVAL, "chain: stage %d is empty", i);
        for (int j = 0; j < i; j++)
            if (order[j] == order[i])
                return sl_err_set(err, SL_EINVAL, "chain: device %d used twice", order[i]);
    }
    return 0;
}

static int overflow_err(const bal_problem *pb, const int *order, int p, const int *cuts, int m,
                        int schedule, int i, const char *algo, sl_err *err)
{
    int d = order[i], k = bal_inflight(schedule, i, p, m);
    uint64_t need = pb->pstatic[cuts[i + 1]] - pb->pstatic[cuts[i]] +
                    (uint64_t)k * (pb->pstash[cuts[i + 1]] - pb->pstash[cuts[i]]);
    return sl_err_set(err, SL_EINVAL,
                      "%s: stage %d on %s (units %d-%d, %d micro-batches stashed) needs %llu "
                      "bytes, the device has %llu: short by %llu bytes",
                      algo, i, pb->dev[d].id, cuts[i], cuts[i + 1] - 1, k,
                      (unsigned long long)need, (unsigned long long)pb->dev[d].mem_bytes,
                      (unsigned long long)(need - pb->dev[d].mem_bytes));
}

bal_plan *bal_plan_chain(const bal_problem *pb, const int *order, int p, const int *cuts, int m,
                         int schedule, sl_err *err)
{
    if (check_chain(pb, order, p, cuts, m, err))
        return NULL;
    int i = bal_plan_overflow(pb, order, p, cuts, m, schedule);
    if (i >= 0) {
        overflow_err(pb, order, p, cuts, m, schedule, i, "chain", err);
        return NULL;
    }
    return bal_plan_build(pb, BAL_OPTIMAL, order, p, cuts, m, schedule);
}

/* The micro-batch count: the smallest m whose estimated bubble
 * (1 - m cycle / estimate) is at most the target; for GPipe also the largest
 * whose stash still fits. */
int bal_choose_m(const bal_problem *pb, const int *order, int p, const int *cuts,
                 const bal_opts *o)
{
    if (o->micro_batches > 0)
        return o->micro_batches;
    int mmax = o->max_micro_batches > 0 ? o->max_micro_batches : 1024;
    int best = 1;
    for (int m = 1; m <= mmax; m++) {
        if (o->schedule == BAL_GPIPE && bal_plan_overflow(pb, order, p, cuts, m, o->schedule) >= 0)
            break;
        best = m;
        double cyc = bal_chain_cycle(pb, order, p, cuts, m, o->schedule, o->window);
        double est = bal_estimate(pb, order, p, cuts, m, o->schedule, cyc);
        if (1 - m * cyc / est <= o->target_bubble)
            break;
    }
    return best;
}

/* even: floor(n/D) units each in the given order, the first n mod D one more. */
static int even_cuts(const bal_problem *pb, int *order, int *cuts)
{
    int n = pb->n_units, p = pb->n_dev < n ? pb->n_dev : n;
    int q = n / p, r = n % p;
    cuts[0] = 0;
    for (int i = 0; i < p; i++) {
        order[i] = i;
        cuts[i + 1] = cuts[i] + q + (i < r);
    }
    return p;
}

/* sky: the paper's allocator as described. Load of a device = its seconds per
 * forward FLOP x the forward FLOPs of its units (no backward, no links).
 * Start from even, repair memory by moving boundary units to a neighbour,
 * then move boundary units between neighbours, either way, while that lowers
 * the larger of the two loads (at most 1000 passes). */
static double sky_load(const bal_problem *pb, int d, int a, int b)
{
    double f = 0;
    for (int u = a; u < b; u++)
        f += pb->unit[u].fwd_flops;
    return f / pb->rate[d];
}

static int sky_cuts(const bal_problem *pb, int *order, int *cuts, int m, int schedule)
{
    int p = even_cuts(pb, order, cuts);
#define FITS(i, a, b) bal_fits(pb, order[i], a, b, bal_inflight(schedule, i, p, m))
    for (int it = 0; it < 4 * pb->n_units * p + 4; it++) {
        int bad = -1;
        for (int i = 0; i < p && bad < 0; i++)
            if (!FITS(i, cuts[i], cuts[i + 1]))
                bad = i;
        if (bad < 0)
            break;
        int i = bad, moved = 0;
        if (cuts[i + 1] - cuts[i] < 2)
            return -1;
        /* to the right neighbour if it takes the unit, else to the left */
        if (i + 1 < p && FITS(i + 1, cuts[i + 1] - 1, cuts[i + 2])) {
            cuts[i + 1]--;
            moved = 1;
        } else if (i > 0 && FITS(i - 1, cuts[i - 1], cuts[i] + 1)) {
            cuts[i]++;
            moved = 1;
        } else if (i + 1 < p) {
            cuts[i + 1]--; /* push the excess along; the neighbour repairs next */
            moved = 1;
        } else if (i > 0) {
            cuts[i]++;
            moved = 1;
        }
        if (!moved)
            return -1;
    }
    if (bal_plan_overflow(pb, order, p, cuts, m, schedule) >= 0)
        return -1;
    for (int pass = 0; pass < 1000; pass++) {
        int moved = 0;
        for (int i = 0; i + 1 < p; i++) {
            int a = cuts[i], c = cuts[i + 1], b = cuts[i + 2];
            double li = sky_load(pb, order[i], a, c), lj = sky_load(pb, order[i + 1], c, b);
            double old = li > lj ? li : lj;
            if (li > lj && c - a >= 2) {
                double ni = sky_load(pb, order[i], a, c - 1), nj = sky_load(pb, order[i + 1], c - 1, b);
                if ((ni > nj ? ni : nj) < old && FITS(i + 1, c - 1, b)) {
                    cuts[i + 1]--;
                    moved = 1;
                }
            } else if (lj > li && b - c >= 2) {
                double ni = sky_load(pb, order[i], a, c + 1), nj = sky_load(pb, order[i + 1], c + 1, b);
                if ((ni > nj ? ni : nj) < old && FITS(i, a, c + 1)) {
                    cuts[i + 1]++;
                    moved = 1;
                }
            }
        }
        if (!moved)
            break;
    }
#undef FITS
    return p;
}

/* Baseline plans for the given m (0: choose). NULL with a message if memory fails. */
bal_plan *bal_plan_baseline(const bal_problem *pb, int algo, const bal_opts *o, int m,
                            sl_err *err)
{
    int n = pb->n_units;
    int *order = sl_xmalloc((size_t)pb->n_dev * sizeof(int));
    int *cuts = sl_xmalloc(((size_t)pb->n_dev + 1) * sizeof(int));
    int m0 = m > 0 ? m : (o->schedule == BAL_GPIPE ? 1 : o->max_micro_batches);
    int p;
    if (algo == BAL_EVEN) {
        p = even_cuts(pb, order, cuts);
    } else {
        p = sky_cuts(pb, order, cuts, m0, o->schedule);
        if (p < 0) {
            sl_err_set(err, SL_EINVAL, "sky: memory repair failed: the units do not fit on the "
                       "devices in the given order");
            free(order);
            free(cuts);
            return NULL;
        }
    }
    bal_opts oo = *o;
    oo.micro_batches = m;
    int mm = bal_choose_m(pb, order, p, cuts, &oo);
    int i = bal_plan_overflow(pb, order, p, cuts, mm, o->schedule);
    bal_plan *pl = NULL;
    if (i >= 0)
        overflow_err(pb, order, p, cuts, mm, o->schedule, i, bal_algo_name(algo), err);
    else {
        pl = bal_plan_build(pb, algo, order, p, cuts, mm, o->schedule);
        for (int k = 0; k < pl->n_dropped; k++)
            snprintf(pl->dropped[k].reason, sizeof pl->dropped[k].reason,
                     "more devices than the %d units", n);
    }
    free(order);
    free(cuts);
    return pl;
}

bal_plan *bal_plan_make(const bal_problem *pb, int algo, const bal_opts *opts, sl_err *err)
{
    bal_opts o = opts ? *opts : bal_opts_default();
    if (o.schedule != BAL_1F1B && o.schedule != BAL_GPIPE) {
        sl_err_set(err, SL_EINVAL, "unknown schedule %d", o.schedule);
        return NULL;
    }
    if (o.micro_batches < 0 || o.micro_batches > 1000000 || o.max_micro_batches < 0 ||
        o.max_micro_batches > 1000000) {
        sl_err_set(err, SL_EINVAL, "micro-batch count out of range");
        return NULL;
    }
    if (o.max_micro_batches == 0)
        o.max_micro_batches = 1024;
    double t0 = sl_now_s();
    bal_plan *pl;
    if (algo == BAL_EVEN || algo == BAL_SKY)
        pl = bal_plan_baseline(pb, algo, &o, o.micro_batches, err);
    else if (algo == BAL_OPTIMAL)
        pl = bal_plan_optimal(pb, &o, err);
    else {
        sl_err_set(err, SL_EINVAL, "unknown algorithm %d", algo);
        return NULL;
    }
    if (pl)
        pl->plan_s = sl_now_s() - t0;
    return pl;
}
