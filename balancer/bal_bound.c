/* bal_bound.c - a lower bound on the iteration time of every plan of a
 * problem (docs/balancer.md, "A bound that certifies the gap", proves it).
 *
 * Every stage i of every plan, whatever its schedule and warm-up, starts
 * its first op (F0) only after micro-batch 0 went forward through stages
 * 0..i-1, computes m (f_i + b_i) after that, and its last op (B of the last
 * micro-batch) must still travel back through stages i-1..0 before stage 0
 * steps its optimizer:
 *     T >= sum_{j<i} (t_j + rt_j) + m t_i + opt_0.
 * With t_j >= w_j / v_j (w: the FLOPs a stage holds, v: the device's best
 * FLOP/s over the units) and rt_j >= r (the cheapest round trip between two
 * devices), the most work any chain can cover within T - opt is found
 * greedily on the devices sorted fastest first: x_0 = c, t_i = x_i / m,
 * x_{i+1} = x_i - t_i - r. The bound is the smallest c whose work covers
 * the model. */
#include <math.h>
#include <stdlib.h>

#include "bal_int.h"
#include "sl_mem.h"

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* The cheapest round trip of the smallest boundary between two devices. */
static double min_round_trip(const bal_problem *pb)
{
    int n = pb->n_units, D = pb->n_dev, ns = pb->n_sites;
    if (n < 2 || D < 2)
        return 0;
    double bytes = INFINITY;
    for (int u = 0; u + 1 < n; u++)
        bytes = fmin(bytes, (double)pb->unit[u].out_bytes);
    double fwd = bytes * pb->wire_act, back = bytes * pb->wire_grad;
    int *count = sl_xcalloc((size_t)ns, sizeof(int)), hosts = 0;
    for (int d = 0; d < D; d++) {
        count[pb->site_of[d]]++;
        hosts |= pb->host_of[d] >= 0 && pb->host_of[d] != d;
    }
    double r = INFINITY, sf, sr;
    if (hosts)
        r = bal_round_trip(pb->same_host, pb->same_host, fwd, back, &sf, &sr);
    for (int a = 0; a < ns; a++) {
        if (count[a] >= 2)
            r = fmin(r, bal_round_trip(pb->inside[a], pb->inside[a], fwd, back, &sf, &sr));
        for (int b = 0; b < ns; b++)
            if (b != a && count[a] && count[b])
                r = fmin(r, bal_round_trip(pb->between[(size_t)a * ns + b],
                                           pb->between[(size_t)b * ns + a], fwd, back, &sf, &sr));
    }
    free(count);
    return isfinite(r) ? r : 0;
}

/* The most work the devices (speeds v, fastest first) cover within c. */
static double cover(const double *v, int k, int m, double r, double c)
{
    double x = c, w = 0, q = 1 - 1.0 / m;
    for (int i = 0; i < k && x > 0; i++) {
        if (isinf(v[i]))
            return INFINITY;
        w += v[i] * x / m;
        x = x * q - r;
    }
    return w;
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
    double r = min_round_trip(pb), lo = 0, hi = 1;
    if (W > 0 && !isinf(v[0])) {
        while (cover(v, k, m, r, hi) < W && hi < 1e30)
            hi *= 2;
        for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; it++) {
            double mid = 0.5 * (lo + hi);
            if (cover(v, k, m, r, mid) >= W)
                hi = mid;
            else
                lo = mid;
        }
    } else
        hi = 0;
    free(v);
    /* stage 0 holds unit 0 and steps its optimizer last */
    double opt = INFINITY;
    for (int d = 0; d < D; d++)
        if (data_owner < 0 || d == data_owner)
            opt = fmin(opt, bal_optim_s(pb, d, 0, 0));
    return lo + opt;
}
