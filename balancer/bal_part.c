/* bal_part.c - the objective of a chain, its exact minimum over cut points,
 * the two baselines (even, sky) and turning cuts into a plan.
 *
 * The objective ("cycle", seconds per micro-batch in steady state) of a
 * chain cut into stages: the largest of
 *   - every stage's fwd+bwd time t_i and every link's serialization time;
 *   - for 1F1B, every run of stages i..j: (sum of t_k + the round trips
 *     rt_l = latency + serialization both ways on the links between them)
 *     / (j - i + 1). Stage i runs one more micro-batch ahead than stage i+1,
 *     so j-i+1 micro-batches must cover the round trip from i to j and back:
 *     a slow link between two lightly loaded stages still stalls both.
 * Exact minimum for a fixed chain: for a bound B let
 *   h_i = max over j >= i of sum_{k=i..j} (t_k - B) + sum_{l=i..j-1} rt_l
 *       = (t_i - B) + max(0, rt_i + h_{i+1}),
 * so every run fits iff every h_i <= 0. h_i only grows with h_{i+1}, so the
 * smallest h over the rest of the chain is always the best to extend:
 *   g_i(s) = min over e of  t_i(s,e) - B + max(0, rt_i(e) + g_{i+1}(e))
 * is exact, with g_i(s) = +inf when a constraint fails. Feasibility of
 * [s,e) (time <= B, memory) is hereditary, so the admissible e form a window
 * whose ends only grow with s, and the term inside the min does not depend
 * on s: a monotone deque gives each stage in O(n). Feasibility is monotone in
 * B and the optimum is one of finitely many values, so bisection on B, each
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
                  .target_bubble = 0.10, .window = 1, .data_owner = -1,
                  .first_device = -1};
    return o;
}

/* Round trip (latency + serialization both ways) and the larger one-way
 * serialization of the boundary before unit e on the link a <-> b. */
static double round_trip(const bal_problem *pb, int a, int b, int e, double *ser_max)
{
    double sf, sr;
    double rt = bal_cut_round_trip(pb, bal_problem_link(pb, a, b), bal_problem_link(pb, b, a), e,
                                   &sf, &sr);
    *ser_max = sf > sr ? sf : sr;
    return rt;
}

double bal_chain_cycle(const bal_problem *pb, const bal_chain *c, const int *cuts)
{
    int p = c->p;
    double cyc = 0;
    double *t = sl_xmalloc((size_t)p * sizeof(double)), *rt = sl_xmalloc((size_t)p * sizeof(double));
    int *k = sl_xmalloc((size_t)p * sizeof(int)), u = bal_is_u(c);
    bal_inflight(c, k);
    if (u && !bal_owner_fits(pb, c->order[0], cuts[1], k[0], cuts[p - 1], k[p - 1])) {
        cyc = INFINITY;
        goto out;
    }
    for (int i = 0; i < p; i++) {
        int d = c->order[i];
        if (!(u && (i == 0 || i == p - 1)) && !bal_fits(pb, d, cuts[i], cuts[i + 1], k[i])) {
            cyc = INFINITY;
            goto out;
        }
        t[i] = bal_time(pb, d, cuts[i], cuts[i + 1]);
        if (t[i] > cyc)
            cyc = t[i];
        rt[i] = 0;
        if (i < p - 1) {
            double smax;
            rt[i] = round_trip(pb, d, c->order[i + 1], cuts[i + 1], &smax);
            if (smax > cyc)
                cyc = smax;
        }
    }
    if (u && t[0] + t[p - 1] > cyc) /* the owner computes both of its stages */
        cyc = t[0] + t[p - 1];
    if (c->window && c->schedule == BAL_1F1B)
        for (int i = 0; i < p; i++) {
            double S = 0, slots = 0;
            for (int j = i; j < p; j++) {
                S += t[j];
                slots += 1;
                if (j > i) {
                    S += rt[j - 1];
                    slots += c->extra ? c->extra[j - 1] : 0;
                }
                if (S / slots > cyc)
                    cyc = S / slots;
            }
        }
out:
    free(t);
    free(rt);
    free(k);
    return cyc;
}

void bal_chain_lookahead(const bal_problem *pb, const int *order, int p, double cycle, int m,
                         int *extra)
{
    int e = pb->n_units - 1; /* BERT boundaries all carry B x T x H; take the largest */
    for (int u = 0; u + 1 < pb->n_units; u++)
        if (pb->unit[u].out_bytes > pb->unit[e - 1].out_bytes)
            e = u + 1;
    for (int l = 0; l + 1 < p; l++) {
        double smax, rt = round_trip(pb, order[l], order[l + 1], e, &smax);
        double x = cycle > 0 && rt > 0.5 * cycle ? ceil(rt / cycle) : 0;
        extra[l] = x > m ? m : (int)x;
    }
}

/* The last cut e >= eh (and >= s) such that units s..e-1 on device d take
 * at most Bi and fit its memory with k micro-batches stashed: emem, the
 * last cut memory allows (mem_reach), or with owner_ub >= 0 (a U's first
 * stage) fitting together with the owner's last stage from owner_ub on,
 * k_last stashed. Feasibility is hereditary, so eh only grows with s. */
static inline int stage_reach(const bal_problem *pb, const double *pre, int d, int s, int eh,
                              int emax, int emem, double Bi, int k, int owner_ub, int k_last)
{
    if (eh < s)
        eh = s;
    if (owner_ub >= 0) {
        while (eh + 1 <= emax && pre[eh + 1] - pre[s] <= Bi &&
               bal_owner_fits(pb, d, eh + 1, k, owner_ub, k_last))
            eh++;
        return eh;
    }
    int lim = emem < emax ? emem : emax;
    while (eh + 1 <= lim && pre[eh + 1] - pre[s] <= Bi)
        eh++;
    return eh;
}

/* For every start s in [smin, smax], the last cut e <= emax whose stage
 * s..e-1 fits device d's memory with k stashed (s when none does): it does
 * not depend on the bound, so each chain computes it once. */
static void mem_reach(const bal_problem *pb, int d, int k, int smin, int smax, int emax, int *emem)
{
    int e = smin;
    for (int s = smin; s <= smax; s++) {
        if (e < s)
            e = s;
        while (e + 1 <= emax && bal_fits(pb, d, s, e + 1, k))
            e++;
        emem[s] = e;
    }
}

typedef struct dp_ws {
    double *g, *gn, *v;
    int *nxt, *dq, *k, p;
    /* per (stage i, cut): the round trip over the link after stage i when
     * it ends at the cut, its larger serialization, and the last cut stage
     * i may reach from the cut as its start by memory (mem_reach) */
    double *rt, *ser;
    int *emem;
    /* U-shaped chains: the last stage is fixed to cuts ub..n (time t_last);
     * the first stage shares the owner with it. ub < 0: not U-shaped. */
    int ub;
    double t_last;
    long long cells; /* stage x cut cells visited: the work done */
    int *lo, *hi;    /* p + 1: the starts each stage may have (dp_windows) */
} dp_ws;

/* Stage i's bound at B: a U-shaped chain's first stage shares its owner
 * with the last. */
static inline double stage_bound(const dp_ws *w, int i, double B)
{
    return w->ub >= 0 && i == 0 ? B - w->t_last : B;
}

/* Whether units s..e-1 fit stage i at bound B, time and memory. */
static inline int stage_fits(const bal_problem *pb, const bal_chain *c, const dp_ws *w, int i,
                             int s, int e, double B)
{
    const double *pre = pb->pre + (size_t)c->order[i] * ((size_t)pb->n_units + 1);
    if (pre[e] - pre[s] > stage_bound(w, i, B))
        return 0;
    if (w->ub >= 0 && i == 0)
        return bal_owner_fits(pb, c->order[0], e, w->k[0], w->ub, w->k[c->p - 1]);
    return bal_fits(pb, c->order[i], s, e, w->k[i]);
}

/* The starts each stage can have at bound B, the runs of stages left out:
 * at most hi[i], the furthest cut stages 0..i-1 reach, each as long as it
 * fits (reach only grows with the start, feasibility being hereditary); at
 * least lo[i], the nearest cut from which stage i reaches lo[i+1] (a start
 * from which stages i..p-1 cover the rest: a stage that reaches past
 * lo[i+1] also reaches lo[i+1]). The DP looks only between them: the same
 * result for less work, since near the optimum most stages have a few
 * starts. 0 when some stage has none. */
static int dp_windows(const bal_problem *pb, const bal_chain *c, double B, dp_ws *w)
{
    int n = pb->n_units, p = c->p, *lo = w->lo, *hi = w->hi;
    size_t n1 = (size_t)n + 1;
    hi[0] = 0;
    for (int i = 0; i + 1 < p; i++) {
        int smax = i == 0 ? 0 : n - (p - i), emax = n - (p - 1 - i);
        int s = hi[i] < smax ? hi[i] : smax, d = c->order[i], own = w->ub >= 0 && i == 0;
        if (s < i) /* stages 0..i-1 cannot hold a unit each */
            return 0;
        hi[i + 1] = stage_reach(pb, pb->pre + (size_t)d * n1, d, s, s, emax,
                                own ? emax : w->emem[(size_t)i * n1 + s], stage_bound(w, i, B),
                                w->k[i], own ? w->ub : -1, w->k[p - 1]);
    }
    lo[p] = n;
    for (int i = p - 1; i >= 0; i--) {
        int smin = i, e = lo[i + 1], s = e;
        if (i == p - 1 && w->ub >= 0)
            s = w->ub < e ? w->ub : e;
        else if (i == 0) /* the first stage starts at unit 0 */
            s = e > 0 && stage_fits(pb, c, w, 0, 0, e, B) ? 0 : e;
        else
            while (s - 1 >= smin && stage_fits(pb, c, w, i, s - 1, e, B))
                s--;
        lo[i] = s;
        int smax = i == 0 ? 0 : n - (p - i);
        if ((lo[i] > smin ? lo[i] : smin) > (hi[i] < smax ? hi[i] : smax))
            return 0;
    }
    return 1;
}

/* One feasibility test at bound B; on success fills cuts. */
static int dp_feasible(const bal_problem *pb, const bal_chain *c, double B, dp_ws *w, int *cuts)
{
    int n = pb->n_units, p = c->p;
    size_t n1 = (size_t)n + 1;
    double *g = w->g, *gn = w->gn;
    w->cells += (long long)p * n;
    if (!dp_windows(pb, c, B, w))
        return 0;
    int runs = c->window && c->schedule == BAL_1F1B;
    for (int i = p - 1; i >= 0; i--) {
        int d = c->order[i], k = w->k[i];
        int smin = i, smax = i == 0 ? 0 : n - (p - i), emax = n - (p - 1 - i);
        if (smin < w->lo[i])
            smin = w->lo[i];
        if (smax > w->hi[i])
            smax = w->hi[i];
        const double *pre = pb->pre + (size_t)d * n1;
        int *nxt = w->nxt + (size_t)i * n1;
        if (i == p - 1) {
            for (int s = smin; s <= smax; s++) {
                double t = pre[n] - pre[s];
                int ok = w->ub >= 0 ? s == w->ub && t <= B : t <= B && bal_fits(pb, d, s, n, k);
                g[s] = ok ? t - B : INFINITY;
                nxt[s] = n;
            }
        } else {
            /* v(e) = prefix + max(0, round trip - lookahead slots + rest) */
            const double *rt = w->rt + (size_t)i * n1, *ser = w->ser + (size_t)i * n1;
            double ahead = c->extra ? c->extra[i] * B : 0;
            if (!isfinite(ahead))
                ahead = 0;
            /* ends are the next stage's starts */
            int elo = w->lo[i + 1] > smin + 1 ? w->lo[i + 1] : smin + 1;
            int ehi = w->hi[i + 1] < emax ? w->hi[i + 1] : emax;
            for (int e = elo; e <= ehi; e++) {
                if (gn[e] == INFINITY || ser[e] > B) {
                    w->v[e] = INFINITY;
                    continue;
                }
                double x = rt[e] - ahead + gn[e];
                w->v[e] = pre[e] + (x > 0 ? x : 0);
            }
            /* the first stage of a U-shaped chain shares the owner with the last */
            int own = w->ub >= 0 && i == 0;
            double Bi = stage_bound(w, i, B);
            int head = 0, tail = 0, eh = smin, push = elo;
            for (int s = smin; s <= smax; s++) {
                eh = stage_reach(pb, pre, d, s, eh, emax, w->emem[(size_t)i * n1 + s], Bi, k,
                                 own ? w->ub : -1, w->k[p - 1]);
                if (push < s + 1)
                    push = s + 1;
                for (; push <= eh && push <= ehi; push++) {
                    if (w->v[push] == INFINITY)
                        continue;
                    while (tail > head && w->v[w->dq[tail - 1]] >= w->v[push])
                        tail--;
                    w->dq[tail++] = push;
                }
                while (tail > head && w->dq[head] < s + 1)
                    head++;
                g[s] = INFINITY;
                if (tail > head) {
                    int e = w->dq[head];
                    double h = w->v[e] - pre[s] - B;
                    nxt[s] = e;
                    if (!runs || h <= 0)
                        g[s] = h;
                }
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

/* Feasibility at bound B; a U-shaped chain tries every start of the owner's
 * last stage whose time fits (there are few: its time grows as it starts
 * earlier). */
static int feasible(const bal_problem *pb, const bal_chain *c, double B, dp_ws *w, int *cuts)
{
    if (!bal_is_u(c)) {
        w->ub = -1;
        return dp_feasible(pb, c, B, w, cuts);
    }
    int n = pb->n_units, p = c->p, d = c->order[0];
    for (int b = n - 1; b >= p - 1; b--) {
        w->ub = b;
        w->t_last = bal_time(pb, d, b, n);
        if (w->t_last > B || !bal_owner_fits(pb, d, 1, w->k[0], b, w->k[p - 1]))
            break;
        if (dp_feasible(pb, c, B, w, cuts))
            return 1;
    }
    return 0;
}

double bal_chain_best(const bal_problem *pb, const bal_chain *ch, int *cuts)
{
    return bal_chain_best_tol(pb, ch, cuts, 1e-10);
}

double bal_chain_best_tol(const bal_problem *pb, const bal_chain *ch, int *cuts, double tol)
{
    return bal_chain_best_work(pb, ch, cuts, tol, 0, NULL);
}

double bal_chain_best_work(const bal_problem *pb, const bal_chain *ch, int *cuts, double tol,
                           double hint, long long *work)
{
    int n = pb->n_units, p = ch->p;
    if (p < 1 || p > n)
        return INFINITY;
    size_t n1 = (size_t)n + 1;
    dp_ws w = {.cells = 0};
    w.g = sl_xmalloc(n1 * sizeof(double));
    w.gn = sl_xmalloc(n1 * sizeof(double));
    w.v = sl_xmalloc(n1 * sizeof(double));
    w.dq = sl_xmalloc(n1 * sizeof(int));
    w.nxt = sl_xmalloc((size_t)p * n1 * sizeof(int));
    w.k = sl_xmalloc((size_t)p * sizeof(int));
    w.p = p;
    bal_inflight(ch, w.k);
    w.rt = sl_xmalloc((size_t)p * n1 * sizeof(double));
    w.ser = sl_xmalloc((size_t)p * n1 * sizeof(double));
    w.emem = sl_xmalloc((size_t)p * n1 * sizeof(int));
    w.lo = sl_xmalloc(((size_t)p + 1) * sizeof(int));
    w.hi = sl_xmalloc(((size_t)p + 1) * sizeof(int));
    for (int i = 0; i < p; i++) {
        int d = ch->order[i], smin = i, smax = i == 0 ? 0 : n - (p - i), emax = n - (p - 1 - i);
        mem_reach(pb, d, w.k[i], smin, smax, emax, w.emem + (size_t)i * n1);
        if (i == p - 1)
            continue;
        bal_link f = bal_problem_link(pb, d, ch->order[i + 1]);
        bal_link r = bal_problem_link(pb, ch->order[i + 1], d);
        for (int e = smin + 1; e <= emax; e++) {
            double sf, sr;
            w.rt[(size_t)i * n1 + e] = bal_cut_round_trip(pb, f, r, e, &sf, &sr);
            w.ser[(size_t)i * n1 + e] = sf > sr ? sf : sr;
        }
    }
    int *c = sl_xmalloc(((size_t)p + 1) * sizeof(int));
    double hi = INFINITY, lo = 0;
    if (feasible(pb, ch, INFINITY, &w, c)) {
        hi = bal_chain_cycle(pb, ch, c);
        memcpy(cuts, c, ((size_t)p + 1) * sizeof(int));
        /* the cycle a feasible cut achieves tightens hi below mid; on long
         * chains (O(p^2) to evaluate) plain bisection is cheaper */
        int tighten = p <= 128;
        /* a hint (a neighbouring chain's cycle) brackets the optimum in two tests */
        for (int j = 0; j < 2 && hint > 0; j++) {
            double b = hint * (j ? 0.98 : 1.02);
            if (!(b > lo && b < hi))
                continue;
            if (feasible(pb, ch, b, &w, c)) {
                double got = tighten ? bal_chain_cycle(pb, ch, c) : b;
                if (got < hi) {
                    hi = got;
                    memcpy(cuts, c, ((size_t)p + 1) * sizeof(int));
                } else
                    hi = b;
            } else
                lo = b;
        }
        for (int it = 0; it < 200 && hi - lo > tol * hi; it++) {
            double mid = lo > 0 && hi > 4 * lo ? sqrt(lo * hi) : 0.5 * (lo + hi);
            if (feasible(pb, ch, mid, &w, c)) {
                double got = tighten ? bal_chain_cycle(pb, ch, c) : mid;
                if (!(got < hi)) { /* rounding: the bound was met only to the last bit */
                    hi = mid;
                    continue;
                }
                hi = got;
                memcpy(cuts, c, ((size_t)p + 1) * sizeof(int));
            } else
                lo = mid;
        }
        hi = bal_chain_cycle(pb, ch, cuts);
    }
    free(w.g);
    free(w.gn);
    free(w.v);
    free(w.dq);
    free(w.nxt);
    free(w.k);
    free(w.rt);
    free(w.ser);
    free(w.emem);
    free(w.lo);
    free(w.hi);
    free(c);
    if (work)
        *work += w.cells;
    return hi;
}

/* ---- the shortest fill at a given cycle bound ----
 *
 * Among the cuts whose cycle is at most B, the one whose first micro-batch
 * travels fastest: the smallest R = sum of stage times t_i + sum of link
 * round trips rt_i (the estimate's fill term). Backwards over the stages,
 * every (stage i, start cut s) keeps the Pareto front of (R, h) over the
 * suffixes it can start: R of stages i..p-1, and h_i as in the bisection's
 * DP (every run starting at i fits iff h_i <= 0; the stage before uses h_i
 * only through max(0, rt - lookahead + h_i), so h_i is first raised to the
 * value below which that term is 0 and entries equal there collapse). A
 * suffix with a larger R and a larger h is never better, so the front is
 * exact. It is capped at FILL_FRONT entries (the smallest R, the smallest h
 * and spread between); on the tests' instances and the benchmark's 64-device
 * chains the largest front holds 6. */
#define FILL_FRONT 48

typedef struct fill_ent {
    double R, h;
    int nx; /* the next stage's entry in the pool, -1 at the last stage */
    int e;  /* this stage's end cut */
} fill_ent;

typedef struct fill_ws {
    fill_ent *pool, *tmp;
    int npool, cap, ntmp, captmp;
    int *off, *cnt; /* per (stage, cut): the front's first pool entry and size */
    int *k, ub;
    double t_last;
    int *emem; /* the stage being placed: mem_reach */
} fill_ws;

static int cmp_fill(const void *x, const void *y)
{
    const fill_ent *a = x, *b = y;
    if (a->R != b->R)
        return a->R < b->R ? -1 : 1;
    if (a->h != b->h)
        return a->h < b->h ? -1 : 1;
    if (a->e != b->e)
        return a->e - b->e;
    return a->nx - b->nx;
}

static void fill_tmp(fill_ws *w, double R, double h, int nx, int e)
{
    if (w->ntmp == w->captmp) {
        w->captmp = w->captmp ? 2 * w->captmp : 256;
        w->tmp = sl_xrealloc(w->tmp, (size_t)w->captmp * sizeof *w->tmp);
    }
    w->tmp[w->ntmp++] = (fill_ent){R, h, nx, e};
}

/* Moves the Pareto front of the candidates in tmp to the pool; its size. */
static int fill_front(fill_ws *w)
{
    if (!w->ntmp)
        return 0;
    qsort(w->tmp, (size_t)w->ntmp, sizeof *w->tmp, cmp_fill);
    int nf = 0;
    for (int j = 0; j < w->ntmp; j++) /* by R; keep each strictly smaller h */
        if (nf == 0 || w->tmp[j].h < w->tmp[nf - 1].h)
            w->tmp[nf++] = w->tmp[j];
    int keep = nf;
    if (nf > FILL_FRONT) { /* the first, the last and spread between */
        keep = FILL_FRONT;
        for (int j = 0; j < keep; j++)
            w->tmp[j] = w->tmp[(int)((long)j * (nf - 1) / (keep - 1))];
    }
    if (w->npool + keep > w->cap) {
        while (w->npool + keep > w->cap)
            w->cap = w->cap ? 2 * w->cap : 1024;
        w->pool = sl_xrealloc(w->pool, (size_t)w->cap * sizeof *w->pool);
    }
    memcpy(w->pool + w->npool, w->tmp, (size_t)keep * sizeof *w->tmp);
    w->npool += keep;
    return keep;
}

/* One DP at bound B (w->ub: the U's last stage start, or -1); the smallest R
 * with its cuts, or INFINITY. */
static double fill_dp(const bal_problem *pb, const bal_chain *c, double B, fill_ws *w, int *cuts)
{
    int n = pb->n_units, p = c->p;
    size_t n1 = (size_t)n + 1;
    int runs = c->window && c->schedule == BAL_1F1B;
    w->npool = 0;
    for (int i = p - 1; i >= 0; i--) {
        int d = c->order[i], k = w->k[i];
        int smin = i, smax = i == 0 ? 0 : n - (p - i), emax = n - (p - 1 - i);
        const double *pre = pb->pre + (size_t)d * n1;
        int *off = w->off + (size_t)i * n1, *cnt = w->cnt + (size_t)i * n1;
        const int *offn = w->off + (size_t)(i + 1) * n1, *cntn = w->cnt + (size_t)(i + 1) * n1;
        bal_link f = {0}, r = {0}, fp = {0}, rp = {0};
        if (i < p - 1) {
            f = bal_problem_link(pb, d, c->order[i + 1]);
            r = bal_problem_link(pb, c->order[i + 1], d);
        }
        if (i > 0) {
            fp = bal_problem_link(pb, c->order[i - 1], d);
            rp = bal_problem_link(pb, d, c->order[i - 1]);
        }
        double ahead = i < p - 1 && c->extra ? c->extra[i] * B : 0;
        double ahead_prev = i > 0 && c->extra ? c->extra[i - 1] * B : 0;
        if (!isfinite(ahead))
            ahead = 0;
        if (!isfinite(ahead_prev))
            ahead_prev = 0;
        int own = w->ub >= 0 && i == 0;
        double Bi = own ? B - w->t_last : B;
        int eh = smin;
        if (i < p - 1 && !own)
            mem_reach(pb, d, k, smin, smax, emax, w->emem);
        for (int s = smin; s <= smax; s++) {
            w->ntmp = 0;
            cnt[s] = 0;
            off[s] = w->npool;
            /* the h below which the stage before sees 0 */
            double floor_h = -INFINITY;
            if (runs && i > 0) {
                double sf, sr;
                floor_h = -(bal_cut_round_trip(pb, fp, rp, s, &sf, &sr) -
                            ahead_prev);
            }
            if (i == p - 1) {
                double t = pre[n] - pre[s];
                int ok = w->ub >= 0 ? s == w->ub && t <= B : t <= B && bal_fits(pb, d, s, n, k);
                if (ok)
                    fill_tmp(w, t, runs ? fmax(t - B, floor_h) : 0, -1, n);
            } else {
                eh = stage_reach(pb, pre, d, s, eh, emax, own ? emax : w->emem[s], Bi, k,
                                 own ? w->ub : -1, w->k[p - 1]);
                for (int e = s + 1; e <= eh; e++) {
                    double sf, sr;
                    double rt = bal_cut_round_trip(pb, f, r, e, &sf, &sr);
                    if (sf > B || sr > B)
                        continue;
                    double t = pre[e] - pre[s];
                    for (int j = 0; j < cntn[e]; j++) {
                        const fill_ent *x = &w->pool[offn[e] + j];
                        double h = 0;
                        if (runs) {
                            double y = rt - ahead + x->h;
                            h = t - B + (y > 0 ? y : 0);
                            if (h > 0)
                                continue;
                            h = fmax(h, floor_h);
                        }
                        fill_tmp(w, t + rt + x->R, h, offn[e] + j, e);
                    }
                }
            }
            if (i == 0 && w->ntmp > 1) /* nothing before: only R matters */
                for (int j = 0; j < w->ntmp; j++)
                    w->tmp[j].h = 0;
            cnt[s] = fill_front(w);
        }
    }
    if (!w->cnt[0])
        return INFINITY;
    const fill_ent *x = &w->pool[w->off[0]];
    double R = x->R;
    cuts[0] = 0;
    for (int i = 0; i < p; i++) {
        cuts[i + 1] = x->e;
        if (x->nx >= 0)
            x = &w->pool[x->nx];
    }
    return R;
}

double bal_chain_fill(const bal_problem *pb, const bal_chain *ch, double bound, int *cuts)
{
    int n = pb->n_units, p = ch->p;
    if (p < 1 || p > n || !(bound >= 0))
        return INFINITY;
    size_t n1 = (size_t)n + 1;
    fill_ws w = {.ub = -1};
    w.off = sl_xcalloc(((size_t)p + 1) * n1, sizeof(int));
    w.cnt = sl_xcalloc(((size_t)p + 1) * n1, sizeof(int));
    w.k = sl_xmalloc((size_t)p * sizeof(int));
    w.emem = sl_xmalloc(n1 * sizeof(int));
    bal_inflight(ch, w.k);
    int *c = sl_xmalloc(((size_t)p + 1) * sizeof(int));
    double best = INFINITY;
    if (!bal_is_u(ch)) {
        best = fill_dp(pb, ch, bound, &w, cuts);
    } else { /* every start b of the owner's last stage whose time fits */
        int d = ch->order[0];
        for (int b = n - 1; b >= p - 1; b--) {
            w.ub = b;
            w.t_last = bal_time(pb, d, b, n);
            if (w.t_last > bound || !bal_owner_fits(pb, d, 1, w.k[0], b, w.k[p - 1]))
                break;
            double R = fill_dp(pb, ch, bound, &w, c);
            if (R < best) {
                best = R;
                memcpy(cuts, c, ((size_t)p + 1) * sizeof(int));
            }
        }
    }
    free(w.pool);
    free(w.tmp);
    free(w.off);
    free(w.cnt);
    free(w.k);
    free(w.emem);
    free(c);
    return best;
}

/* ---- falling profiles ----
 *
 * A 1F1B stage that warms up with w forwards runs, after its first
 * backward, m - 1 backwards and m - 1 - w forwards one after another, and
 * its first backward waits for micro-batch 0's trip through the whole
 * chain (S + R). So a stage early in the chain, with a deep warm-up, may
 * hold more than a late one for the same iteration: its critical path is
 * S + R + (m - 1) b_i + (m - 1 - w_i) f_i, while the round trip behind it
 * keeps it from starting its backwards much sooner. bal_chain_falling
 * bounds every stage's (m - 1) b_i + (m - 1 - gamma w_i) f_i by X (gamma in
 * [0, 1] says how much of the warm-up to count on) and among those cuts
 * returns one with the smallest S. Stage i's bound depends only on its
 * units, so the DP is the bisection's without its runs of stages: a
 * sliding minimum over each stage's reach. */
double bal_chain_falling(const bal_problem *pb, const bal_chain *c, double gamma, double X,
                         int *cuts)
{
    int n = pb->n_units, p = c->p, m = c->m;
    if (p < 1 || p > n || c->schedule != BAL_1F1B || bal_is_u(c) || !(X >= 0))
        return INFINITY;
    size_t n1 = (size_t)n + 1;
    int *k = sl_xmalloc((size_t)p * sizeof(int)), *nxt = sl_xmalloc((size_t)p * n1 * sizeof(int));
    int *dq = sl_xmalloc(n1 * sizeof(int));
    double *best = sl_xmalloc(n1 * sizeof(double)), *next = sl_xmalloc(n1 * sizeof(double));
    double *pf = sl_xmalloc(n1 * sizeof(double)), *val = sl_xmalloc(n1 * sizeof(double));
    bal_inflight(c, k);
    for (int e = 0; e <= n; e++)
        next[e] = e == n ? 0 : INFINITY;
    for (int i = p - 1; i >= 0; i--) {
        int d = c->order[i], smin = i, smax = i == 0 ? 0 : n - (p - i), emax = n - (p - 1 - i);
        const double *pre = pb->pre + (size_t)d * n1;
        const double *tf = pb->tf + (size_t)d * n;
        double wf = (m - 1) - gamma * (k[i] - 1); /* the forwards' weight, the backwards' m - 1 */
        pf[0] = 0;
        for (int u = 0; u < n; u++)
            pf[u + 1] = pf[u] + tf[u];
        for (int e = smin + 1; e <= emax; e++)
            val[e] = next[e] < INFINITY ? pre[e] + next[e] : INFINITY;
        int head = 0, tail = 0, reach = smin, push = smin + 1;
        for (int s = 0; s <= n; s++)
            best[s] = INFINITY;
        for (int s = smin; s <= smax; s++) {
            if (reach < s)
                reach = s;
            while (reach + 1 <= emax && bal_fits(pb, d, s, reach + 1, k[i])) {
                double f = pf[reach + 1] - pf[s], b = pre[reach + 1] - pre[s] - f;
                if ((m - 1) * b + wf * f > X)
                    break;
                reach++;
            }
            if (push < s + 1)
                push = s + 1;
            for (; push <= reach; push++) {
                if (val[push] == INFINITY)
                    continue;
                while (tail > head && val[dq[tail - 1]] >= val[push])
                    tail--;
                dq[tail++] = push;
            }
            while (tail > head && dq[head] < s + 1)
                head++;
            if (tail > head) {
                best[s] = val[dq[head]] - pre[s];
                nxt[(size_t)i * n1 + s] = dq[head];
            }
        }
        double *t = next;
        next = best;
        best = t;
    }
    double S = next[0];
    if (S < INFINITY) {
        cuts[0] = 0;
        for (int i = 0; i < p; i++)
            cuts[i + 1] = nxt[(size_t)i * n1 + cuts[i]];
    }
    free(k);
    free(nxt);
    free(dq);
    free(best);
    free(next);
    free(pf);
    free(val);
    return S;
}

int bal_plan_overflow(const bal_problem *pb, const bal_chain *c, const int *cuts)
{
    int p = c->p, *k = sl_xmalloc((size_t)p * sizeof(int)), bad = -1, u = bal_is_u(c);
    bal_inflight(c, k);
    if (u && !bal_owner_fits(pb, c->order[0], cuts[1], k[0], cuts[p - 1], k[p - 1]))
        bad = 0;
    for (int i = u; i < p - u && bad < 0; i++)
        if (!bal_fits(pb, c->order[i], cuts[i], cuts[i + 1], k[i]))
            bad = i;
    free(k);
    return bad;
}

double bal_estimate(const bal_problem *pb, const bal_chain *c, const int *cuts, double cycle)
{
    /* fill and drain cost the first micro-batch's round trip under both schedules */
    double R = 0, opt = 0;
    for (int i = 0; i < c->p; i++) {
        int d = c->order[i];
        R += bal_time(pb, d, cuts[i], cuts[i + 1]);
        double o = bal_optim_s(pb, d, cuts[i], cuts[i + 1] - 1);
        if (o > opt)
            opt = o;
        if (i < c->p - 1) {
            double smax;
            R += round_trip(pb, d, c->order[i + 1], cuts[i + 1], &smax);
        }
    }
    if (bal_is_u(c)) { /* the owner steps both of its stages */
        int d = c->order[0], p = c->p;
        double o = bal_optim_s(pb, d, 0, cuts[1] - 1) + bal_optim_s(pb, d, cuts[p - 1], cuts[p] - 1);
        if (o > opt)
            opt = o;
    }
    return R + (c->m - 1) * cycle + opt;
}

bal_plan *bal_plan_build(const bal_problem *pb, int algo, const bal_chain *c, const int *cuts)
{
    int p = c->p;
    bal_plan *pl = sl_xcalloc(1, sizeof *pl);
    pl->algo = algo;
    pl->schedule = c->schedule;
    pl->micro_batches = c->m;
    pl->n_units = pb->n_units;
    pl->n_stages = p;
    pl->stage = sl_xcalloc((size_t)p, sizeof *pl->stage);
    pl->data_owner = bal_is_u(c) ? c->order[0] : -1;
    pl->unit_fwd_s = sl_xmalloc((size_t)pb->n_units * sizeof(double));
    pl->unit_bwd_s = sl_xmalloc((size_t)pb->n_units * sizeof(double));
    pl->unit_optim_s = sl_xmalloc((size_t)pb->n_units * sizeof(double));
    int *k = sl_xmalloc((size_t)p * sizeof(int));
    bal_inflight(c, k);
    unsigned char *used = sl_xcalloc((size_t)pb->n_dev, 1);
    for (int i = 0; i < p; i++) {
        bal_stage *s = &pl->stage[i];
        int d = c->order[i], a = cuts[i], b = cuts[i + 1];
        used[d] = 1;
        s->device = d;
        memcpy(s->id, pb->dev[d].id, BAL_NAME_MAX);
        memcpy(s->site, pb->dev[d].site, BAL_NAME_MAX);
        memcpy(s->cpu_pool, pb->dev[d].cpu_pool, BAL_NAME_MAX);
        s->pool_cpus = pb->dev[d].pool_cpus;
        s->cpus = pb->dev[d].cpus;
        memcpy(s->net_ns, pb->dev[d].net_ns, BAL_NAME_MAX);
        s->first = a;
        s->last = b - 1;
        for (int u = a; u < b; u++) {
            pl->unit_fwd_s[u] = bal_unit_fwd_s(pb, d, u);
            pl->unit_bwd_s[u] = bal_unit_bwd_s(pb, d, u);
            pl->unit_optim_s[u] = pb->topt[(size_t)d * pb->n_units + u];
            s->fwd_s += pl->unit_fwd_s[u];
            s->bwd_s += pl->unit_bwd_s[u];
        }
        s->optim_s = bal_optim_s(pb, d, a, b - 1);
        s->static_bytes = pb->pstatic[b] - pb->pstatic[a];
        s->stash_bytes = pb->pstash[b] - pb->pstash[a];
        s->mem_bytes = pb->dev[d].mem_bytes;
        s->max_inflight = k[i];
        s->warmup = c->schedule == BAL_GPIPE ? c->m : k[i] - 1;
        if (i < p - 1) {
            s->extra = c->extra ? c->extra[i] : 0;
            bal_link f = bal_problem_link(pb, d, c->order[i + 1]);
            bal_link r = bal_problem_link(pb, c->order[i + 1], d);
            s->lat_s = 0.5 * (f.lat + r.lat); /* links are symmetric in our inputs */
            s->act_s = bal_act_bytes(pb, b) / f.bw;
            s->grad_s = bal_grad_bytes(pb, b) / r.bw;
        }
    }
    free(k);
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
    bal_chain cc = *c;
    cc.window = c->schedule == BAL_1F1B;
    pl->cycle_s = bal_chain_cycle(pb, &cc, cuts);
    pl->est_iter_s = bal_estimate(pb, c, cuts, pl->cycle_s);
    return pl;
}

void bal_plan_free(bal_plan *pl)
{
    if (!pl)
        return;
    free(pl->stage);
    free(pl->dropped);
    free(pl->unit_fwd_s);
    free(pl->unit_bwd_s);
    free(pl->unit_optim_s);
    free(pl);
}

static int check_chain(const bal_problem *pb, const bal_chain *c, const int *cuts, sl_err *err)
{
    int p = c->p, u = c->ushaped != 0;
    if (p < 1 || p > pb->n_dev + u || p > pb->n_units || c->m < 1 ||
        (c->schedule != BAL_1F1B && c->schedule != BAL_GPIPE))
        return sl_err_set(err, SL_EINVAL, "chain: need 1..%d stages, m >= 1 and a schedule",
                          pb->n_dev + u < pb->n_units ? pb->n_dev + u : pb->n_units);
    if (u && (p < 3 || c->order[0] != c->order[p - 1]))
        return sl_err_set(err, SL_EINVAL, "chain: a U-shaped chain has at least 3 stages, the "
                          "first and the last on the same device");
    if (cuts[0] != 0 || cuts[p] != pb->n_units)
        return sl_err_set(err, SL_EINVAL, "chain: cuts must run from 0 to %d", pb->n_units);
    for (int i = 0; i < p; i++) {
        if (c->order[i] < 0 || c->order[i] >= pb->n_dev)
            return sl_err_set(err, SL_EINVAL, "chain: device %d out of range", c->order[i]);
        if (cuts[i + 1] <= cuts[i])
            return sl_err_set(err, SL_EINVAL, "chain: stage %d is empty", i);
        if (c->extra && i < p - 1 && (c->extra[i] < 0 || c->extra[i] > 1000000))
            return sl_err_set(err, SL_EINVAL, "chain: extra[%d] out of range", i);
        for (int j = 0; j < i; j++)
            if (c->order[j] == c->order[i] && !(u && j == 0 && i == p - 1))
                return sl_err_set(err, SL_EINVAL, "chain: device %d used twice", c->order[i]);
    }
    return 0;
}

static int overflow_err(const bal_problem *pb, const bal_chain *c, const int *cuts, int i,
                        const char *algo, sl_err *err)
{
    int *kk = sl_xmalloc((size_t)c->p * sizeof(int));
    bal_inflight(c, kk);
    int d = c->order[i], k = kk[i], p = c->p;
    uint64_t need = bal_mem_need(pb->pstatic[cuts[i + 1]] - pb->pstatic[cuts[i]],
                                 pb->pstash[cuts[i + 1]] - pb->pstash[cuts[i]], k);
    if (bal_is_u(c) && i == 0) {
        need = bal_owner_need(pb, cuts[1], k, cuts[p - 1], kk[p - 1]);
        free(kk);
        return sl_err_set(err, SL_EINVAL,
                          "%s: data owner %s (units 0-%d and %d-%d) needs %llu bytes, the device "
                          "has %llu: short by %llu bytes", algo, pb->dev[d].id, cuts[1] - 1,
                          cuts[p - 1], cuts[p] - 1, (unsigned long long)need,
                          (unsigned long long)pb->dev[d].mem_bytes,
                          (unsigned long long)(need - pb->dev[d].mem_bytes));
    }
    free(kk);
    return sl_err_set(err, SL_EINVAL,
                      "%s: stage %d on %s (units %d-%d, %d micro-batches stashed) needs %llu "
                      "bytes, the device has %llu: short by %llu bytes",
                      algo, i, pb->dev[d].id, cuts[i], cuts[i + 1] - 1, k,
                      (unsigned long long)need, (unsigned long long)pb->dev[d].mem_bytes,
                      (unsigned long long)(need - pb->dev[d].mem_bytes));
}

bal_plan *bal_plan_chain(const bal_problem *pb, const bal_chain *c, const int *cuts, sl_err *err)
{
    if (check_chain(pb, c, cuts, err))
        return NULL;
    int i = bal_plan_overflow(pb, c, cuts);
    if (i >= 0) {
        overflow_err(pb, c, cuts, i, "chain", err);
        return NULL;
    }
    return bal_plan_build(pb, BAL_OPTIMAL, c, cuts);
}

/* The micro-batch count: the smallest m whose estimated bubble
 * (1 - m cycle / estimate) is at most the target; for GPipe also the largest
 * whose stash still fits. */
int bal_choose_m(const bal_problem *pb, const bal_chain *c, const int *cuts, const bal_opts *o)
{
    if (o->micro_batches > 0)
        return o->micro_batches;
    int mmax = o->max_micro_batches > 0 ? o->max_micro_batches : 1024;
    /* the cycle does not depend on m, only memory does; m = 1 fits whenever any m fits */
    bal_chain cc = *c;
    cc.m = 1;
    double cyc = bal_chain_cycle(pb, &cc, cuts);
    double est1 = bal_estimate(pb, &cc, cuts, cyc);
    int best = 1;
    for (int m = 1; m <= mmax && isfinite(cyc); m++) {
        cc.m = m;
        if (o->schedule == BAL_GPIPE && bal_plan_overflow(pb, &cc, cuts) >= 0)
            break;
        best = m;
        if (1 - m * cyc / (est1 + (m - 1) * cyc) <= o->target_bubble)
            break;
    }
    return best;
}

int bal_even_cuts(int n_units, int p, int *cuts)
{
    if (p > n_units)
        p = n_units;
    int q = n_units / p, r = n_units % p;
    cuts[0] = 0;
    for (int i = 0; i < p; i++)
        cuts[i + 1] = cuts[i] + q + (i < r);
    return p;
}

/* even: floor(n/D) units each in the given order, the first n mod D one more.
 * With a data owner: the owner first, the others in the given order, the
 * owner again last (the owner alone if there is no room between). With a
 * first device (first >= 0): it first, the others in the given order. */
static int even_cuts(const bal_problem *pb, int owner, int first, int *order, int *cuts)
{
    int n = pb->n_units, p = 0;
    if (owner < 0 && first >= 0) {
        order[p++] = first;
        for (int d = 0; d < pb->n_dev && p < n; d++)
            if (d != first)
                order[p++] = d;
    } else if (owner >= 0) {
        order[p++] = owner;
        for (int d = 0; d < pb->n_dev && p < n - 1; d++)
            if (d != owner)
                order[p++] = d;
        if (p >= 2)
            order[p++] = owner;
        else
            p = 1;
    } else {
        p = pb->n_dev < n ? pb->n_dev : n;
        for (int i = 0; i < p; i++)
            order[i] = i;
    }
    bal_even_cuts(n, p, cuts);
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

static int sky_cuts(const bal_problem *pb, int owner, int first, int *order, int *cuts, int m,
                    int schedule)
{
    int p = even_cuts(pb, owner, first, order, cuts);
    bal_chain c = {.p = p, .order = order, .m = m, .schedule = schedule,
                   .ushaped = owner >= 0 && p >= 3};
    int *k = sl_xmalloc((size_t)p * sizeof(int));
    bal_inflight(&c, k);
#define FITS(i, a, b) bal_fits(pb, order[i], a, b, k[i])
    for (int it = 0; it < 4 * pb->n_units * p + 4; it++) {
        int bad = -1;
        for (int i = 0; i < p && bad < 0; i++)
            if (!FITS(i, cuts[i], cuts[i + 1]))
                bad = i;
        if (bad < 0)
            break;
        int i = bad;
        if (cuts[i + 1] - cuts[i] < 2 || p == 1) {
            p = -1;
            goto out;
        }
        /* to the right neighbour if it takes the unit, else to the left, else
         * push the excess along and let the neighbour repair next */
        if (i + 1 < p && FITS(i + 1, cuts[i + 1] - 1, cuts[i + 2]))
            cuts[i + 1]--;
        else if (i > 0 && FITS(i - 1, cuts[i - 1], cuts[i] + 1))
            cuts[i]++;
        else if (i + 1 < p)
            cuts[i + 1]--;
        else
            cuts[i]++;
    }
    if (bal_plan_overflow(pb, &c, cuts) >= 0) {
        p = -1;
        goto out;
    }
    for (int pass = 0; pass < 1000; pass++) {
        int moved = 0;
        for (int i = 0; i + 1 < p; i++) {
            int a = cuts[i], x = cuts[i + 1], b = cuts[i + 2];
            double li = sky_load(pb, order[i], a, x), lj = sky_load(pb, order[i + 1], x, b);
            double old = li > lj ? li : lj;
            if (li > lj && x - a >= 2) {
                double ni = sky_load(pb, order[i], a, x - 1), nj = sky_load(pb, order[i + 1], x - 1, b);
                if ((ni > nj ? ni : nj) < old && FITS(i + 1, x - 1, b)) {
                    cuts[i + 1]--;
                    moved = 1;
                }
            } else if (lj > li && b - x >= 2) {
                double ni = sky_load(pb, order[i], a, x + 1), nj = sky_load(pb, order[i + 1], x + 1, b);
                if ((ni > nj ? ni : nj) < old && FITS(i, a, x + 1)) {
                    cuts[i + 1]++;
                    moved = 1;
                }
            }
        }
        if (!moved)
            break;
    }
#undef FITS
out:
    free(k);
    return p;
}

/* The same schedule rule for every algorithm: a lookahead sized for the
 * chain's own stage and link times, kept only if memory allows it. */
static void baseline_extra(const bal_problem *pb, bal_chain *c, const int *cuts, int *extra)
{
    bal_chain plain = *c;
    plain.extra = NULL;
    plain.window = 0;
    double cyc = bal_chain_cycle(pb, &plain, cuts);
    c->extra = NULL;
    if (c->schedule != BAL_1F1B || !isfinite(cyc))
        return;
    bal_chain_lookahead(pb, c->order, c->p, cyc, c->m, extra);
    c->extra = extra;
    if (bal_plan_overflow(pb, c, cuts) >= 0)
        c->extra = NULL;
}

/* Baseline plans for the given m (0: choose). NULL with a message if memory fails. */
bal_plan *bal_plan_baseline(const bal_problem *pb, int algo, const bal_opts *o, int m,
                            sl_err *err)
{
    int n = pb->n_units, owner = o->data_owner;
    int *order = sl_xmalloc(((size_t)pb->n_dev + 1) * sizeof(int));
    int *cuts = sl_xmalloc(((size_t)pb->n_dev + 2) * sizeof(int));
    int *extra = sl_xcalloc((size_t)pb->n_dev + 1, sizeof(int));
    int m0 = m > 0 ? m : (o->schedule == BAL_GPIPE ? 1 : o->max_micro_batches);
    int p;
    bal_plan *pl = NULL;
    if (algo == BAL_EVEN) {
        p = even_cuts(pb, owner, o->first_device, order, cuts);
    } else if ((p = sky_cuts(pb, owner, o->first_device, order, cuts, m0, o->schedule)) < 0) {
        sl_err_set(err, SL_EINVAL, "sky: memory repair failed: the units do not fit on the "
                   "devices in the given order");
        goto out;
    }
    bal_chain c = {.p = p, .order = order, .m = m0, .schedule = o->schedule, .window = o->window,
                   .ushaped = owner >= 0 && p >= 3};
    bal_opts oo = *o;
    oo.micro_batches = m;
    c.m = bal_choose_m(pb, &c, cuts, &oo);
    baseline_extra(pb, &c, cuts, extra);
    int i = bal_plan_overflow(pb, &c, cuts);
    if (i >= 0)
        overflow_err(pb, &c, cuts, i, bal_algo_name(algo), err);
    else {
        pl = bal_plan_build(pb, algo, &c, cuts);
        pl->data_owner = owner;
        for (int k = 0; k < pl->n_dropped; k++)
            snprintf(pl->dropped[k].reason, sizeof pl->dropped[k].reason,
                     "more devices than the %d units", n);
    }
out:
    free(order);
    free(cuts);
    free(extra);
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
    if (o.data_owner < -1 || o.data_owner >= bal_problem_n_devices(pb)) {
        sl_err_set(err, SL_EINVAL, "data owner %d is not a device (0..%d, or -1 for none)",
                   o.data_owner, bal_problem_n_devices(pb) - 1);
        return NULL;
    }
    if (o.first_device < -1 || o.first_device >= bal_problem_n_devices(pb) ||
        (o.data_owner >= 0 && o.first_device >= 0 && o.first_device != o.data_owner)) {
        sl_err_set(err, SL_EINVAL, "first device %d is not a device (0..%d, or -1 for any)%s",
                   o.first_device, bal_problem_n_devices(pb) - 1,
                   o.data_owner >= 0 ? ", or differs from the data owner" : "");
        return NULL;
    }
    if (o.data_owner >= 0)
        o.first_device = -1; /* a U starts at its owner anyway */
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
