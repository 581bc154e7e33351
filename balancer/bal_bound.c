/* bal_bound.c - a lower bound on the iteration time of every plan of a
 * problem (docs/balancer.md, "A bound that certifies the gap", proves it).
 *
 * Every stage i of every plan, whatever its schedule and warm-up, starts
 * its first op (F0) only after micro-batch 0 went forward through stages
 * 0..i-1, computes m (f_i + b_i) after that, and its last op (B of the last
 * micro-batch) must still travel back through stages i-1..0 before stage 0
 * steps its optimizer:
 *     T >= sum_{j<i} (t_j + rt_j) + m t_i + opt_0.                      (1)
 * Its first backward waits for a micro-batch's forward through every stage
 * and backward through the later ones, and m backwards follow:
 *     T >= S + R + (m - 1) b_i + opt_0,  S = sum_j t_j, R = sum_j rt_j.  (2)
 * With t_j >= w_j / v_j (w: the FLOPs a stage holds, v: the device's best
 * FLOP/s over the units), b_j >= beta t_j and rt_j >= r (the cheapest round
 * trip between two devices), the most work any chain can cover within
 * c = T - opt is found greedily on the devices sorted fastest first, for
 * each range of stage counts and of the largest stage time. The bound is
 * the smallest c whose work covers the model. */
#include <math.h>
#include <stdlib.h>

#include "bal_int.h"
#include "sl_mem.h"

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

static int cmp_int_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

/* The least a chain of p stages spends on its links, for p = 1..k: R[p] in
 * round trips (latency and serialization both ways of the smallest
 * boundary) and G[p] in the norm's gather (both latencies of every link).
 * A link inside a site (or a host) costs at least the cheapest such link,
 * one between sites the cheapest of those, and a chain of d distinct
 * devices visits at least as many sites as the fewest sites that hold d
 * devices, so it crosses at least that many less one between sites. With
 * a data owner, p stages run on p - 1 devices. */
static void link_floor(const bal_problem *pb, int k, int owner, double *R, double *G)
{
    int n = pb->n_units, D = pb->n_dev, ns = pb->n_sites;
    double bytes = INFINITY;
    for (int u = 0; u + 1 < n; u++)
        bytes = fmin(bytes, (double)pb->unit[u].out_bytes);
    double fwd = bytes * pb->wire_act, back = bytes * pb->wire_grad, sf, sr;
    int *count = sl_xcalloc((size_t)ns, sizeof(int)), hosts = 0;
    for (int d = 0; d < D; d++) {
        count[pb->site_of[d]]++;
        hosts |= pb->host_of[d] >= 0 && pb->host_of[d] != d;
    }
    /* [0]: inside a site or a host, [1]: between sites */
    double rt[2] = {INFINITY, INFINITY}, lat[2] = {INFINITY, INFINITY};
    if (hosts) {
        rt[0] = bal_round_trip(pb->same_host, pb->same_host, fwd, back, &sf, &sr);
        lat[0] = 2 * pb->same_host.lat;
    }
    for (int a = 0; a < ns; a++) {
        if (count[a] >= 2) {
            rt[0] = fmin(rt[0], bal_round_trip(pb->inside[a], pb->inside[a], fwd, back, &sf, &sr));
            lat[0] = fmin(lat[0], 2 * pb->inside[a].lat);
        }
        for (int b = 0; b < ns; b++)
            if (b != a && count[a] && count[b]) {
                bal_link f = pb->between[(size_t)a * ns + b], r = pb->between[(size_t)b * ns + a];
                rt[1] = fmin(rt[1], bal_round_trip(f, r, fwd, back, &sf, &sr));
                lat[1] = fmin(lat[1], f.lat + r.lat);
            }
    }
    qsort(count, (size_t)ns, sizeof(int), cmp_int_desc);
    for (int p = 1, sites = 1, held = count[0]; p <= k; p++) {
        int devs = owner >= 0 && p > 1 ? p - 1 : p, links = p - 1;
        while (held < devs && sites < ns)
            held += count[sites++];
        int x = sites - 1 < links ? sites - 1 : links; /* links between sites, at least */
        R[p] = G[p] = INFINITY;
        for (int y = x; y <= links; y += links - x > 0 ? links - x : 1) { /* a cost is linear in y */
            double in = links - y > 0 ? (links - y) : 0, bt = y;
            double r = (in ? in * rt[0] : 0) + (bt ? bt * rt[1] : 0);
            double g = (in ? in * lat[0] : 0) + (bt ? bt * lat[1] : 0);
            R[p] = fmin(R[p], r);
            G[p] = fmin(G[p], g);
        }
        if (!isfinite(R[p]))
            R[p] = G[p] = 0; /* no such chain: nothing to add */
    }
    free(count);
}

/* The largest stage time tau is bracketed on a fixed geometric grid
 * (ratio BOUND_RATIO, not relative to c, so that the work below never
 * shrinks as c grows and bisection is sound), BOUND_STEPS brackets below
 * c / m and [0, the lowest] for the rest; stage counts in up to
 * BOUND_GROUPS ranges. */
#define BOUND_RATIO 1.03
#define BOUND_STEPS 100
#define BOUND_GROUPS 16

/* The most work the greedy covers: stages fastest first, each as long as
 * (1) allows ((c - P - R[i + 1]) / m after stages of P seconds, whose links
 * cost at least R[i + 1]), at most cap, until the stages add up to s_max. */
static double greedy(const double *v, int k, int m, const double *R, double c, double cap,
                     double s_max)
{
    double P = 0, w = 0;
    for (int i = 0; i < k; i++) {
        if (isinf(v[i]))
            return INFINITY;
        double t = fmin(fmin((c - P - R[i + 1]) / m, cap), s_max - P);
        if (t <= 0)
            break;
        w += v[i] * t;
        P += t;
    }
    return w;
}

/* Whether the work a chain of the devices (speeds v, fastest first) covers
 * within c under (1) and (2) may reach W, judged by an upper bound on it: a
 * chain of p in [pa, pb] stages whose largest stage time lies in [ta, tb]
 * has every t <= tb, spends at least R[pa] on its links' round trips and
 * G[pa] on the gather, so by (2) S <= c - G[pa] - R[pa] - (m - 1) beta ta;
 * the greedy on the pb fastest devices with those limits, (1) counted from
 * c - G[pa], covers at least its work. */
static int covers(const double *v, int k, int m, const double *R, const double *G, double beta,
                  double c, double W)
{
    int groups = k < BOUND_GROUPS ? k : BOUND_GROUPS;
    double top = c / m;
    /* the grid points tau_j = BOUND_RATIO^j, j1 the first at or above c / m */
    double j1 = ceil(log(top) / log(BOUND_RATIO));
    for (int g = 0; g < groups; g++) {
        int pa = 1 + (int)((long)k * g / groups), pb = (int)((long)k * (g + 1) / groups);
        double cg = c - G[pa];
        if (cg <= 0)
            continue;
        for (int j = 0; j <= BOUND_STEPS; j++) {
            double ta = j == BOUND_STEPS ? 0 : pow(BOUND_RATIO, j1 - j - 1);
            double tb = pow(BOUND_RATIO, j1 - j);
            double s_max = cg - R[pa] - (m > 1 ? (m - 1) * beta * ta : 0);
            if (s_max <= 0)
                continue;
            if (greedy(v, pb, m, R, cg, tb, s_max) >= W)
                return 1;
        }
    }
    return 0;
}

double bal_lower_bound(const bal_problem *pb, int m, int data_owner)
{
    int n = pb->n_units, D = pb->n_dev;
    if (m < 1 || data_owner >= D)
        return 0;
    double W = 0;
    for (int u = 0; u < n; u++)
        W += pb->unit[u].fwd_flops + pb->unit[u].bwd_flops;
    /* each device's best FLOP/s over the units, so that every unit takes at
     * least its FLOPs / v there; the data owner runs two stages */
    double *v = sl_xmalloc(((size_t)D + 1) * sizeof(double));
    int k = 0;
    for (int d = 0; d < D; d++) {
        double s = 0;
        for (int u = 0; u < n; u++) {
            double w = pb->unit[u].fwd_flops + pb->unit[u].bwd_flops, t = bal_time(pb, d, u, u + 1);
            if (w > 0)
                s = fmax(s, t > 0 ? w / t : INFINITY);
        }
        v[k++] = s;
        if (d == data_owner)
            v[k++] = s;
    }
    qsort(v, (size_t)k, sizeof *v, cmp_desc);
    if (k > n)
        k = n; /* every stage holds a unit */
    /* every stage's backward is at least this share of its time */
    double beta = 1;
    for (int d = 0; d < D; d++)
        for (int u = 0; u < n; u++) {
            double f = bal_unit_fwd_s(pb, d, u), b = bal_unit_bwd_s(pb, d, u);
            if (f + b > 0)
                beta = fmin(beta, b / (f + b));
        }
    double lo = 0, hi = 1;
    double *R = sl_xmalloc(((size_t)k + 1) * sizeof(double)), *G = sl_xmalloc(((size_t)k + 1) * sizeof(double));
    link_floor(pb, k, data_owner, R, G);
    if (W > 0 && !isinf(v[0])) {
        while (!covers(v, k, m, R, G, beta, hi, W) && hi < 1e30)
            hi *= 2;
        for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; it++) {
            double mid = 0.5 * (lo + hi);
            if (covers(v, k, m, R, G, beta, mid, W))
                hi = mid;
            else
                lo = mid;
        }
    } else
        hi = 0;
    free(v);
    free(R);
    free(G);
    /* every stage steps its optimizer after the gather: the one holding unit
     * 0 and the one holding the head (the data owner holds both) */
    double opt0 = INFINITY, opth = INFINITY;
    for (int d = 0; d < D; d++)
        if (data_owner < 0 || d == data_owner) {
            opt0 = fmin(opt0, bal_optim_s(pb, d, 0, 0));
            opth = fmin(opth, bal_optim_s(pb, d, n - 1, n - 1));
        }
    return lo + fmax(opt0, opth);
}

/* ---- one plan's critical path ----
 *
 * The replay without shared compute: every stage runs its computes in
 * their order (bal_stage_computes, those of bal_stage_ops), each as soon
 * as the one before it ended and its input arrived; every directed link
 * sends its messages in the order they were made, one at a time, each
 * arriving one latency after it was sent; once every stage drained, the
 * norm's gather (two latencies per link) and the optimizer steps. Each op
 * starts no earlier than the ops it waits for end, so this is a lower bound
 * on bal_simulate; where no two stages share a device or a cpu pool it is
 * the same replay (docs/balancer.md), in a sweep over the ops instead of
 * events through a heap. */
double bal_plan_critical_path(const bal_plan *pl)
{
    int p = pl->n_stages, m = pl->micro_batches;
    if (p < 1 || m < 1 || (double)p * m > 5e7)
        return 0;
    size_t P = (size_t)p, M = (size_t)m;
    /* ints: each stage's computes (mb forward, -(mb + 1) backward), its next;
     * doubles: arrival of each activation and gradient (-1: not yet), when
     * each stage and each link either way is free */
    int *ops = sl_xmalloc((P * 2 * M + P) * sizeof(int)), *pc = ops + P * 2 * M;
    double *act = sl_xmalloc((2 * P * M + 3 * P) * sizeof(double)), *grad = act + P * M;
    double *avail = grad + P * M, *lf = avail + P, *lb = lf + P;
    for (size_t j = 0; j < 2 * P * M; j++)
        act[j] = -1;
    for (int i = 0; i < p; i++) {
        bal_stage_computes(pl->schedule, p, i, m, pl->stage[i].warmup, ops + i * 2 * M);
        pc[i] = 0;
        avail[i] = lf[i] = lb[i] = 0;
    }
    /* activations flow down the chain and gradients up: sweep the stages
     * down and up in turn, each as far as its inputs allow */
    for (int progress = 1, down = 1; progress; down = !down) {
        progress = 0;
        for (int j = 0; j < p; j++) {
            int i = down ? j : p - 1 - j, k = pc[i], first = i == 0, last = i + 1 == p;
            const bal_stage *st = &pl->stage[i], *prev = first ? st : &pl->stage[i - 1];
            const int *o = ops + i * 2 * M;
            double *ain = act + i * M, *gin = grad + i * M;
            double *aout = last ? gin : ain + M, *gout = first ? gin : gin - M;
            double av = avail[i], f = st->fwd_s, b = st->bwd_s;
            double ls = first ? 0 : lb[i - 1], fs = lf[i];
            for (; k < 2 * m; k++) {
                int op = o[k];
                if (op >= 0) {
                    double in = first ? 0 : ain[op];
                    if (in < 0)
                        break;
                    av = (av > in ? av : in) + f;
                    if (last) { /* the loss: this stage's backward may start */
                        aout[op] = av;
                    } else { /* the activation to i + 1 */
                        fs = (av > fs ? av : fs) + st->act_s;
                        aout[op] = fs + st->lat_s;
                    }
                } else {
                    double in = gin[-op - 1];
                    if (in < 0)
                        break;
                    av = (av > in ? av : in) + b;
                    if (!first) { /* the gradient to i - 1 */
                        ls = (av > ls ? av : ls) + prev->grad_s;
                        gout[-op - 1] = ls + prev->lat_s;
                    }
                }
            }
            if (k != pc[i]) {
                progress = 1;
                pc[i] = k;
                avail[i] = av;
                lf[i] = fs;
                if (!first)
                    lb[i - 1] = ls;
            }
        }
    }
    double drained = 0, gather = 0, opt = 0;
    int stuck = 0;
    for (int i = 0; i < p; i++) {
        stuck |= pc[i] < 2 * m;
        drained = fmax(drained, avail[i]);
        opt = fmax(opt, pl->stage[i].optim_s);
        if (i + 1 < p)
            gather += 2 * pl->stage[i].lat_s;
    }
    free(ops);
    free(act);
    return stuck ? 0 : drained + gather + opt;
}
