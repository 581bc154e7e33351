/* bal_replan.c - a new plan after devices were lost or joined, moving as
 * little state as the time allows.
 *
 * Candidates: the fastest plan `optimal` finds over the devices present,
 * and, on its chain and on the old chain without the lost devices, the cuts
 * that move the fewest units under each of a ladder of cycle bounds (a DP
 * over stages and cuts: the cost of a stage is the number of its units that
 * another device held before). The simulator times every candidate; the one
 * that moves the fewest units within the margin of the fastest wins. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bal_int.h"
#include "sl_mem.h"

typedef struct rp {
    const bal_problem *pb;
    int n, m, schedule, window;
    int *was;   /* [u]: device (index in pb) that held unit u before, -1: a lost one */
    int *kept;  /* prefix counts, per chain position: units it held before */
    bal_plan *best;
    double best_t;
    int best_moved;
    double fastest_t;
    double margin;
} rp;

static int moved_units(const rp *R, const bal_plan *pl)
{
    int moved = 0;
    for (int i = 0; i < pl->n_stages; i++)
        for (int u = pl->stage[i].first; u <= pl->stage[i].last; u++)
            moved += R->was[u] != pl->stage[i].device;
    return moved;
}

static double replay(const bal_plan *pl)
{
    bal_timeline *tl = bal_simulate(pl, pl->schedule, 0, NULL);
    double t = tl ? tl->iteration_s : INFINITY;
    bal_timeline_free(tl);
    return t;
}

/* Keeps pl if it moves fewer units within the margin, or is faster at as few. */
static void consider(rp *R, bal_plan *pl)
{
    if (!pl)
        return;
    double t = replay(pl);
    int mv = moved_units(R, pl);
    int ok = t <= R->fastest_t * (1 + R->margin);
    int better = !R->best || (ok && (mv < R->best_moved || (mv == R->best_moved && t < R->best_t)));
    if (ok && better) {
        bal_plan_free(R->best);
        R->best = pl;
        R->best_t = t;
        R->best_moved = mv;
    } else
        bal_plan_free(pl);
}

/* The cuts of c that move the fewest units with every stage within B (time,
 * memory, links); U-shaped chains keep the owner's last stage at cut b.
 * Returns 0 if none. */
static int fewest_moves(const rp *R, const bal_chain *c, double B, int b, int *cuts)
{
    const bal_problem *pb = R->pb;
    int n = R->n, p = c->p, u = bal_is_u(c);
    size_t n1 = (size_t)n + 1;
    int *k = sl_xmalloc((size_t)p * sizeof(int));
    bal_inflight(c, k);
    int *best = sl_xmalloc((size_t)(p + 1) * n1 * sizeof(int));
    int *from = sl_xmalloc((size_t)(p + 1) * n1 * sizeof(int));
    int *held = sl_xmalloc(n1 * sizeof(int));
    for (size_t x = 0; x < (size_t)(p + 1) * n1; x++)
        best[x] = INT32_MAX;
    best[0] = 0; /* before stage 0, at cut 0 */
    int last_end = u ? b : n, stages = u ? p - 1 : p;
    double t_last = u ? bal_time(pb, c->order[0], b, n) : 0;
    for (int i = 0; i < stages; i++) {
        int d = c->order[i];
        held[0] = 0;
        for (int x = 0; x < n; x++)
            held[x + 1] = held[x] + (R->was[x] == d);
        for (int e = i + 1; e <= last_end - (stages - 1 - i); e++) {
            if (i == stages - 1 && e != last_end)
                continue;
            if (e < n && i + 1 < p) { /* the link after this stage */
                int nx = c->order[i + 1];
                if (bal_act_bytes(pb, e) / bal_problem_link(pb, d, nx).bw > B ||
                    bal_grad_bytes(pb, e) / bal_problem_link(pb, nx, d).bw > B)
                    continue;
            }
            for (int s = e - 1; s >= i; s--) {
                double t = bal_time(pb, d, s, e) + (u && i == 0 ? t_last : 0);
                if (t > B)
                    break;
                int fits = u && i == 0 ? bal_owner_fits(pb, d, e, k[0], b, k[p - 1])
                                       : bal_fits(pb, d, s, e, k[i]);
                if (!fits)
                    break;
                int prev = best[(size_t)i * n1 + s];
                if (prev == INT32_MAX)
                    continue;
                int cost = prev + (e - s) - (held[e] - held[s]);
                if (cost < best[(size_t)(i + 1) * n1 + e]) {
                    best[(size_t)(i + 1) * n1 + e] = cost;
                    from[(size_t)(i + 1) * n1 + e] = s;
                }
            }
        }
    }
    int ok = best[(size_t)stages * n1 + last_end] != INT32_MAX;
    if (ok) {
        int e = last_end;
        for (int i = stages; i > 0; i--) {
            cuts[i] = e;
            e = from[(size_t)i * n1 + e];
        }
        cuts[0] = 0;
        if (u)
            cuts[p] = n;
        if (u && !(t_last <= B))
            ok = 0;
    }
    free(k);
    free(best);
    free(from);
    free(held);
    return ok;
}

/* Each bound of the ladder above the chain's own cycle: the fewest moves,
 * as textbook 1F1B and with the lookahead that hides slow links. */
static void ladder(rp *R, int *order, int p, int ushaped, int b)
{
    static const double step[] = {0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5};
    const bal_problem *pb = R->pb;
    if (p < 1 || (ushaped && p < 3))
        return;
    int *cuts = sl_xmalloc(((size_t)p + 1) * sizeof(int));
    int *extra = sl_xcalloc((size_t)p, sizeof(int));
    bal_chain c = {.p = p, .order = order, .m = R->m, .schedule = R->schedule,
                   .window = R->window, .ushaped = ushaped};
    double cyc = bal_chain_best(pb, &c, cuts);
    if (cyc < INFINITY && ushaped)
        b = b > 0 ? b : cuts[p - 1];
    for (size_t j = 0; j < sizeof step / sizeof step[0] && cyc < INFINITY; j++) {
        c.extra = NULL;
        if (!fewest_moves(R, &c, cyc * (1 + step[j]), b, cuts))
            continue;
        if (bal_plan_overflow(pb, &c, cuts) < 0)
            consider(R, bal_plan_build(pb, BAL_OPTIMAL, &c, cuts));
        if (R->schedule == BAL_1F1B && p > 1) {
            bal_chain_lookahead(pb, order, p, cyc * (1 + step[j]), R->m, extra);
            c.extra = extra;
            if (bal_plan_overflow(pb, &c, cuts) < 0)
                consider(R, bal_plan_build(pb, BAL_OPTIMAL, &c, cuts));
        }
    }
    free(cuts);
    free(extra);
}

static int find_id(const bal_problem *pb, const char *id)
{
    for (int d = 0; d < pb->n_dev; d++)
        if (!strcmp(pb->dev[d].id, id))
            return d;
    return -1;
}

bal_plan *bal_replan(const bal_problem *pb, const bal_plan *old, const bal_opts *opts,
                     double margin, bal_replan_info *info, sl_err *err)
{
    bal_opts o = opts ? *opts : bal_opts_default();
    int n = pb->n_units, p0 = old->n_stages;
    if (old->n_units != n || p0 < 1) {
        sl_err_set(err, SL_EINVAL, "replan: the old plan has %d units, the model %d", old->n_units, n);
        return NULL;
    }
    if (!(margin >= 0 && margin < 10)) {
        sl_err_set(err, SL_EINVAL, "replan: margin %g must be in [0, 10)", margin);
        return NULL;
    }
    int old_u = old->data_owner >= 0, owner = -1;
    if (old_u || (p0 >= 3 && old->stage[0].device == old->stage[p0 - 1].device))
        owner = find_id(pb, old->stage[0].id);
    if (o.data_owner < 0 && old_u && owner < 0) {
        sl_err_set(err, SL_EINVAL, "replan: the data owner %s is gone (name another with "
                   "bal_opts.data_owner)", old->stage[0].id);
        return NULL;
    }
    if (o.data_owner < 0 && old_u)
        o.data_owner = owner;
    o.micro_batches = old->micro_batches;
    o.schedule = old->schedule;
    rp R = {.pb = pb, .n = n, .m = old->micro_batches, .schedule = old->schedule,
            .window = o.window, .margin = margin};
    R.was = sl_xmalloc((size_t)n * sizeof(int));
    int lost = 0;
    for (int i = 0; i < p0; i++) {
        int d = find_id(pb, old->stage[i].id);
        lost += d < 0;
        for (int u = old->stage[i].first; u <= old->stage[i].last && u < n; u++)
            R.was[u] = d;
    }
    bal_plan *fast = bal_plan_make(pb, BAL_OPTIMAL, &o, err);
    if (!fast) {
        free(R.was);
        return NULL;
    }
    R.fastest_t = replay(fast);
    int fast_moved = moved_units(&R, fast);
    double plan_s = fast->plan_s;
    /* the fastest plan's chain and the old one without the lost devices */
    int *order = sl_xmalloc(((size_t)pb->n_dev + p0 + 2) * sizeof(int));
    int p = 0, u = o.data_owner >= 0;
    for (int i = 0; i < fast->n_stages; i++)
        order[p++] = fast->stage[i].device;
    int fast_b = u && p >= 3 ? fast->stage[p - 1].first : 0;
    ladder(&R, order, p, u && p >= 3, fast_b);
    p = 0;
    for (int i = 0; i < p0; i++) {
        int d = find_id(pb, old->stage[i].id);
        if (d >= 0 && !(u && d == o.data_owner && i > 0 && i < p0 - 1))
            order[p++] = d;
    }
    if (u && (p < 3 || order[0] != o.data_owner || order[p - 1] != o.data_owner))
        p = 0; /* the owner no longer at both ends: only the fastest plan's chain */
    if (!u && o.first_device >= 0 && p > 0 && order[0] != o.first_device)
        p = 0; /* nor when the old chain does not start at the first device */
    int old_b = u && p >= 3 && p0 >= 3 ? old->stage[p0 - 1].first : 0;
    ladder(&R, order, p, u && p >= 3, old_b);
    ladder(&R, order, p, u && p >= 3, 0);
    free(order);
    /* the fastest plan itself */
    bal_plan *keep = R.best;
    double kt = R.best_t;
    int km = R.best_moved;
    R.best = NULL;
    consider(&R, fast);
    if (keep && (km < R.best_moved || (km == R.best_moved && kt < R.best_t))) {
        bal_plan_free(R.best);
        R.best = keep;
        R.best_t = kt;
        R.best_moved = km;
    } else
        bal_plan_free(keep);
    if (info) {
        info->old_s = replay(old);
        info->fastest_s = R.fastest_t;
        info->fastest_moved_units = fast_moved;
        info->new_s = R.best_t;
        info->moved_units = R.best_moved;
        info->lost = lost;
        info->joined = 0;
        for (int d = 0; d < pb->n_dev; d++) {
            int seen = 0;
            for (int i = 0; i < p0 && !seen; i++)
                seen = !strcmp(old->stage[i].id, pb->dev[d].id);
            for (int i = 0; i < old->n_dropped && !seen; i++)
                seen = !strcmp(old->dropped[i].id, pb->dev[d].id);
            info->joined += !seen;
        }
    }
    free(R.was);
    R.best->plan_s = plan_s;
    return R.best;
}
