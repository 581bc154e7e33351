/* bal_exact.c - the exact search over every subset and order of up to
 * BAL_EXACT_MAX devices, in the bottleneck-cycle model: the largest of
 * every stage's compute time (a data owner's two stages added up) and every
 * link's serialization time in either direction, with memory for the
 * textbook 1F1B stash (GPipe: m micro-batches). Latency and the lookahead
 * are left to the placement and the simulator that rank the candidates.
 *
 * For a bound B, reach[S][d] is the set of cuts s such that units s..n-1 can
 * be covered by a chain of exactly the devices S, starting with d (every
 * stage non-empty, time <= B, memory, links). Prepending d'' at cut s adds
 * every cut s'' in [lo(s), s-1], lo(s) being the first cut whose stage
 * s''..s-1 fits d'' (lo only grows with s: feasibility is hereditary). A
 * set of cuts is a bitset, so one bound costs O(2^E E^2 (n/64 + popcount)).
 * The optimum is the smallest feasible B: bisection, each feasible step
 * tightened to the cycle the chain found actually has. A U-shaped chain
 * fixes the owner's last stage at cuts b..n (each b whose time fits) and
 * ends the search with the owner's first stage 0..a. When the units between
 * the first and the last are identical (BERT's layers), which of them the
 * middle of a U covers does not matter, only how many: one search from
 * b = n-1 finds every count, the owner's first stage taking unit 0 alone
 * (its stash is the deepest) and its last stage the rest. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bal_int.h"
#include "sl_mem.h"

typedef uint64_t word;

typedef struct ex {
    const bal_problem *pb;
    int n, W, E, m, schedule, owner;
    const int *dev;  /* E eligible devices (the owner excluded) */
    word *reach;     /* [(S * E + e) * W] */
    int *lo;         /* [(e * (E + 2) + j) * (n + 1) + s]: first cut for a stage ending at s, j stages to the end */
    word *alone;     /* [(e * (E + 2) + j) * W]: the s where lo(s) == s (nothing fits) */
    word *linkok;    /* [(a * E + b) * W]: boundaries the link a-b carries within B */
    word *ownlink;   /* [e * W]: boundaries the link e-owner carries within B */
    int b;           /* U-shaped: the owner's last stage starts here */
    int uniform;     /* units 1..n-2 identical everywhere, boundaries alike */
} ex;

/* Are units 1..n-2 the same on every device, and every boundary alike? */
static int is_uniform(const bal_problem *pb)
{
    int n = pb->n_units;
    if (n < 4)
        return 0;
    const bal_unit *a = &pb->unit[1];
    for (int u = 2; u < n - 1; u++) {
        const bal_unit *b = &pb->unit[u];
        if (b->param_bytes != a->param_bytes || b->optim_bytes != a->optim_bytes ||
            b->stash_bytes != a->stash_bytes || b->out_bytes != a->out_bytes)
            return 0;
    }
    if (pb->unit[0].out_bytes != a->out_bytes)
        return 0;
    for (int d = 0; d < pb->n_dev; d++)
        for (int u = 2; u < n - 1; u++)
            if (bal_unit_fwd_s(pb, d, u) != bal_unit_fwd_s(pb, d, 1) ||
                bal_unit_bwd_s(pb, d, u) != bal_unit_bwd_s(pb, d, 1))
                return 0;
    return 1;
}

static int stash_k(const ex *X, int j) /* j stages from this one to the end */
{
    return X->schedule == BAL_GPIPE ? X->m : (j < X->m ? j : X->m);
}

static void set_range(word *w, int a, int b) /* bits a..b */
{
    for (int i = a; i <= b;) {
        int k = i >> 6, o = i & 63, len = 64 - o;
        if (i + len - 1 > b)
            len = b - i + 1;
        word mask = len == 64 ? ~(word)0 : (((word)1 << len) - 1) << o;
        w[k] |= mask;
        i += len;
    }
}

static int has_bit(const word *w, int i) { return (int)(w[i >> 6] >> (i & 63)) & 1; }

static int link_fits(const bal_problem *pb, int a, int b, int s, double B)
{
    return bal_act_bytes(pb, s) / bal_problem_link(pb, a, b).bw <= B &&
           bal_grad_bytes(pb, s) / bal_problem_link(pb, b, a).bw <= B;
}

/* Tables for bound B: lo per (device, stash depth, end cut) and the links. */
static void tables(ex *X, double B)
{
    const bal_problem *pb = X->pb;
    int n = X->n, E = X->E, W = X->W;
    for (int e = 0; e < E; e++) {
        int d = X->dev[e];
        const double *pre = pb->pre + (size_t)d * (n + 1);
        for (int j = 1; j <= E + 1; j++) {
            int *lo = X->lo + ((size_t)e * (E + 2) + j) * (n + 1), k = stash_k(X, j), s = 0;
            word *al = X->alone + ((size_t)e * (E + 2) + j) * W;
            memset(al, 0, (size_t)W * sizeof(word));
            lo[0] = 0;
            for (int c = 1; c <= n; c++) { /* smallest s with s..c-1 fitting */
                while (s < c && !(pre[c] - pre[s] <= B && bal_fits(pb, d, s, c, k)))
                    s++;
                lo[c] = s; /* s == c: not even unit c-1 alone fits */
                if (s == c)
                    al[c >> 6] |= (word)1 << (c & 63);
            }
        }
    }
    memset(X->linkok, 0, (size_t)E * E * W * sizeof(word));
    for (int a = 0; a < E; a++)
        for (int b = 0; b < E; b++)
            for (int s = 1; s < n && a != b; s++)
                if (link_fits(pb, X->dev[a], X->dev[b], s, B))
                    X->linkok[((size_t)a * E + b) * W + (s >> 6)] |= (word)1 << (s & 63);
    if (X->owner >= 0) {
        memset(X->ownlink, 0, (size_t)E * W * sizeof(word));
        for (int e = 0; e < E; e++)
            for (int s = 1; s < n; s++)
                if (link_fits(pb, X->dev[e], X->owner, s, B))
                    X->ownlink[(size_t)e * W + (s >> 6)] |= (word)1 << (s & 63);
    }
}

/* Lowest set bit >= i, or -1. */
static int next_one(const word *w, int W, int i)
{
    for (int k = i >> 6; k < W; k++) {
        word x = w[k] & (k == i >> 6 ? ~(word)0 << (i & 63) : ~(word)0);
        if (x)
            return (k << 6) + __builtin_ctzll(x);
    }
    return -1;
}

/* Lowest clear bit >= i (W * 64 if none). */
static int next_zero(const word *w, int W, int i)
{
    for (int k = i >> 6; k < W; k++) {
        word x = ~w[k] & (k == i >> 6 ? ~(word)0 << (i & 63) : ~(word)0);
        if (x)
            return (k << 6) + __builtin_ctzll(x);
    }
    return W * 64;
}

/* Adds to out the cuts s'' in [lo(s), s-1] for every s in R. A run of
 * consecutive s a..b gives one interval [lo(a), b-1]: lo(s+1) <= s whenever
 * unit s fits alone, so consecutive intervals touch. `alone` marks the s
 * whose stage cannot even hold unit s-1; a run holding one falls back to
 * the intervals one by one. */
static void prepend(const ex *X, const word *R, const int *lo, const word *alone, word *out)
{
    int W = X->W;
    for (int a = next_one(R, W, 0); a >= 0;) {
        int b = next_zero(R, W, a) - 1;
        int bad = next_one(alone, W, a);
        if (bad < 0 || bad > b) {
            if (lo[a] <= b - 1)
                set_range(out, lo[a], b - 1);
        } else {
            for (int s = a; s <= b; s++)
                if (lo[s] <= s - 1)
                    set_range(out, lo[s], s - 1);
        }
        a = b + 1 < W * 64 ? next_one(R, W, b + 1) : -1;
    }
}

/* Fills reach for the bound the tables were built for. */
static void fill(ex *X)
{
    int n = X->n, E = X->E, W = X->W, u = X->owner >= 0, end = u ? X->b : n;
    size_t NS = (size_t)1 << E;
    memset(X->reach, 0, NS * E * W * sizeof(word));
    word *tmp = sl_xmalloc((size_t)W * sizeof(word));
    for (int e = 0; e < E; e++) { /* one device: the last stage (U: before the owner's) */
        if (u && !has_bit(X->ownlink + (size_t)e * W, end))
            continue;
        const int *lo = X->lo + ((size_t)e * (E + 2) + 1 + u) * (n + 1);
        if (lo[end] < end)
            set_range(X->reach + (((size_t)1 << e) * E + e) * W, lo[end], end - 1);
    }
    for (size_t S = 1; S < NS; S++) {
        int j = __builtin_popcountll(S) + 1 + u; /* stages to the end for a prepended device */
        if (j - u > E)
            continue;
        for (int e = 0; e < E; e++) {
            if (!(S >> e & 1))
                continue;
            const word *R = X->reach + (S * E + e) * W;
            int any = 0;
            for (int k = 0; k < W; k++)
                any |= R[k] != 0;
            if (!any)
                continue;
            for (int f = 0; f < E; f++) {
                if (S >> f & 1)
                    continue;
                const word *L = X->linkok + ((size_t)f * E + e) * W;
                for (int k = 0; k < W; k++)
                    tmp[k] = R[k] & L[k];
                size_t fj = (size_t)f * (E + 2) + j;
                prepend(X, tmp, X->lo + fj * (n + 1), X->alone + fj * W,
                        X->reach + ((S | (size_t)1 << f) * E + f) * W);
            }
        }
    }
    free(tmp);
}

/* U-shaped: the owner's first stage 0..a-1 can precede a chain starting with
 * device e at cut a (its time with the last stage's within B, memory, link). */
static int owner_first_ok(const ex *X, int e, int a, int stages, double B)
{
    const bal_problem *pb = X->pb;
    int d = X->owner, n = X->n;
    double t = bal_time(pb, d, 0, a) + bal_time(pb, d, X->b, n);
    return a >= 1 && t <= B && has_bit(X->ownlink + (size_t)e * X->W, a) &&
           bal_owner_fits(pb, d, a, stash_k(X, stages), X->b, stash_k(X, 1));
}

/* The chain with the fewest stages that reaches cut 0 at bound B (reach
 * filled); order/cuts of the full chain, returns its stage count or 0. */
static int extract(const ex *X, double B, int *order, int *cuts)
{
    int E = X->E, W = X->W, n = X->n, u = X->owner >= 0;
    size_t NS = (size_t)1 << E, bestS = 0;
    int beste = -1, besta = -1;
    for (size_t S = 1; S < NS; S++) {
        int c = __builtin_popcountll(S);
        if (beste >= 0 && c >= __builtin_popcountll(bestS))
            continue;
        for (int e = 0; e < E; e++) {
            if (!(S >> e & 1))
                continue;
            const word *R = X->reach + (S * E + e) * W;
            if (!u && has_bit(R, 0)) {
                bestS = S, beste = e;
                break;
            }
            for (int a = 1; u && a < X->b; a++)
                if (has_bit(R, a) && owner_first_ok(X, e, a, c + 2, B)) {
                    bestS = S, beste = e, besta = a;
                    break;
                }
            if (beste >= 0 && bestS == S)
                break;
        }
    }
    if (beste < 0)
        return 0;
    int p = 0, s = 0, e = beste;
    size_t S = bestS;
    if (u) {
        order[p] = X->owner;
        cuts[p++] = 0;
        s = besta;
    }
    int end = u ? X->b : n;
    for (;;) { /* device e starts at cut s; find where its stage ends */
        order[p] = X->dev[e];
        cuts[p++] = s;
        size_t rest = S & ~((size_t)1 << e);
        int j = __builtin_popcountll(S) + u, next = -1, ecut = -1;
        if (!rest) {
            ecut = end;
        } else {
            for (int c = s + 1; c < end && next < 0; c++) {
                const int *lo = X->lo + ((size_t)e * (E + 2) + j) * (n + 1);
                if (lo[c] > s)
                    break; /* s..c-1 no longer fits */
                for (int f = 0; f < E; f++)
                    if ((rest >> f & 1) && has_bit(X->reach + (rest * E + f) * W, c) &&
                        has_bit(X->linkok + ((size_t)e * E + f) * W, c)) {
                        next = f;
                        ecut = c;
                        break;
                    }
            }
        }
        if (ecut < 0)
            return 0; /* cannot happen: reach said so; a guard */
        if (!rest)
            break;
        s = ecut;
        S = rest;
        e = next;
    }
    if (u) {
        order[p] = X->owner;
        cuts[p++] = X->b;
    }
    cuts[p] = n;
    return p;
}

/* The cycle of a chain in this model (INFINITY when memory fails). */
static double model_cycle(const ex *X, const int *order, const int *cuts, int p)
{
    bal_chain c = {.p = p, .order = order, .m = X->m, .schedule = X->schedule,
                   .ushaped = X->owner >= 0 && p >= 3};
    return bal_chain_cycle(X->pb, &c, cuts);
}

/* Uniform units, U-shaped: with the middle searched from b = n-1, a cut a it
 * reaches is a middle of n-1-a layers, which may as well cover 1..n-a-1:
 * the owner keeps unit 0 and n-a..n-1. Returns that b for the fewest
 * stages, or 0. */
static int uniform_start(ex *X, double B)
{
    int E = X->E, W = X->W, n = X->n, bestb = 0, bestc = 0;
    X->b = n - 1;
    fill(X);
    for (size_t S = 1; S < (size_t)1 << E; S++) {
        int c = __builtin_popcountll(S);
        if (bestb && c >= bestc)
            continue;
        for (int e = 0; e < E && !(bestb && bestc == c); e++) {
            if (!(S >> e & 1) || !has_bit(X->ownlink + (size_t)e * W, 1))
                continue;
            const word *R = X->reach + (S * E + e) * W;
            for (int a = next_one(R, W, 1); a > 0 && a < n - 1; a = next_one(R, W, a + 1)) {
                int b = n - a;
                if (bal_time(X->pb, X->owner, 0, 1) + bal_time(X->pb, X->owner, b, n) <= B &&
                    bal_owner_fits(X->pb, X->owner, 1, stash_k(X, c + 2), b, stash_k(X, 1))) {
                    bestb = b;
                    bestc = c;
                    break;
                }
            }
        }
    }
    return bestb;
}

/* Feasible at B: a chain into order/cuts, its stage count; with `fewest`
 * the one with the fewest stages (U-shaped: over every start of the owner's
 * last stage, else the first that works). */
static int try_bound(ex *X, double B, int *order, int *cuts, int fewest)
{
    tables(X, B);
    if (X->owner < 0) {
        fill(X);
        return extract(X, B, order, cuts);
    }
    int best = 0, n = X->n, *o2 = sl_xmalloc(((size_t)X->E + 2) * sizeof(int)),
        *c2 = sl_xmalloc(((size_t)X->E + 3) * sizeof(int));
    if (X->uniform) { /* one search from n-1 gives every count the middle can hold */
        int b = uniform_start(X, B);
        if (b > 0) {
            X->b = b;
            fill(X);
            best = extract(X, B, order, cuts);
        }
        free(o2);
        free(c2);
        return best;
    }
    for (int b = n - 1; b >= 2; b--) {
        if (bal_time(X->pb, X->owner, b, n) > B)
            break;
        X->b = b;
        fill(X);
        int p = extract(X, B, o2, c2);
        if (p && (!best || p < best)) {
            best = p;
            memcpy(order, o2, (size_t)p * sizeof(int));
            memcpy(cuts, c2, ((size_t)p + 1) * sizeof(int));
        }
        if (best == 3 || (best && !fewest)) /* no U-shaped chain has fewer than 3 */
            break;
    }
    free(o2);
    free(c2);
    return best;
}

int bal_exact_chains(const bal_problem *pb, int m, int schedule, int owner, const double *ladder,
                     int nl, bal_exact_chain *out)
{
    int n = pb->n_units, D = pb->n_dev, E = 0;
    int *dev = sl_xmalloc((size_t)D * sizeof(int));
    for (int d = 0; d < D; d++)
        if (d != owner)
            dev[E++] = d;
    if (E > BAL_EXACT_MAX || (E == 0 && owner < 0)) {
        free(dev);
        return 0;
    }
    ex X = {.pb = pb, .n = n, .W = (n + 64) / 64, .E = E, .m = m, .schedule = schedule,
            .owner = owner, .dev = dev, .uniform = owner >= 0 && is_uniform(pb)};
    X.reach = sl_xmalloc(((size_t)1 << E) * (E + 1) * X.W * sizeof(word));
    X.lo = sl_xmalloc(((size_t)E + 1) * (E + 2) * (n + 1) * sizeof(int));
    X.alone = sl_xmalloc(((size_t)E + 1) * (E + 2) * X.W * sizeof(word));
    X.linkok = sl_xmalloc(((size_t)E * E + 1) * X.W * sizeof(word));
    X.ownlink = sl_xmalloc(((size_t)E + 1) * X.W * sizeof(word));
    int *order = sl_xmalloc(((size_t)E + 2) * sizeof(int));
    int *cuts = sl_xmalloc(((size_t)E + 3) * sizeof(int));
    int nout = 0;
    /* the optimum: bisection from the cycle of a feasible chain */
    double hi = INFINITY, lo = 0;
    int p = E > 0 ? try_bound(&X, INFINITY, order, cuts, 0) : 0;
    if (p) {
        hi = model_cycle(&X, order, cuts, p);
        bal_exact_chain *c = &out[nout++];
        c->p = p;
        memcpy(c->order, order, (size_t)p * sizeof(int));
        memcpy(c->cuts, cuts, ((size_t)p + 1) * sizeof(int));
        c->cycle = hi;
        for (int it = 0; it < 100 && hi - lo > 1e-9 * hi; it++) {
            double mid = lo > 0 && hi > 4 * lo ? sqrt(lo * hi) : 0.5 * (lo + hi);
            int q = try_bound(&X, mid, order, cuts, 0);
            double got = q ? model_cycle(&X, order, cuts, q) : INFINITY;
            if (q && got < hi) {
                hi = got;
                c->p = q;
                memcpy(c->order, order, (size_t)q * sizeof(int));
                memcpy(c->cuts, cuts, ((size_t)q + 1) * sizeof(int));
                c->cycle = hi;
            } else if (q)
                hi = mid; /* met only to the last bit */
            else
                lo = mid;
        }
        /* the fewest stages at the optimum */
        int q = try_bound(&X, hi, order, cuts, 1);
        if (q && q < c->p && model_cycle(&X, order, cuts, q) <= hi) {
            c->p = q;
            memcpy(c->order, order, (size_t)q * sizeof(int));
            memcpy(c->cuts, cuts, ((size_t)q + 1) * sizeof(int));
            c->cycle = model_cycle(&X, order, cuts, q);
        }
        /* fewer stages at looser bounds: less fill for a longer cycle */
        for (int i = 0; i < nl && nout < BAL_EXACT_OUT; i++) {
            double B = out[0].cycle * (1 + ladder[i]);
            int q = try_bound(&X, B, order, cuts, 1);
            if (!q || q >= out[nout - 1].p)
                continue;
            bal_exact_chain *x = &out[nout++];
            x->p = q;
            memcpy(x->order, order, (size_t)q * sizeof(int));
            memcpy(x->cuts, cuts, ((size_t)q + 1) * sizeof(int));
            x->cycle = model_cycle(&X, order, cuts, q);
            if (q <= 1 + 2 * (owner >= 0))
                break;
        }
    }
    if (owner >= 0) { /* the owner alone */
        int one[1] = {owner}, c1[2] = {0, n};
        double t = model_cycle(&X, one, c1, 1);
        if (t < INFINITY) {
            int front = nout == 0 || t < out[0].cycle;
            if (nout == BAL_EXACT_OUT)
                nout--;
            int at = front ? 0 : nout;
            memmove(&out[at + 1], &out[at], (size_t)(nout - at) * sizeof *out);
            out[at] = (bal_exact_chain){.p = 1, .order = {owner}, .cuts = {0, n}, .cycle = t};
            nout++;
        }
    }
    free(order);
    free(cuts);
    free(X.reach);
    free(X.lo);
    free(X.alone);
    free(X.linkok);
    free(X.ownlink);
    free(dev);
    return nout;
}

double bal_exact_best(const bal_problem *pb, int m, int schedule, int data_owner, int *order,
                      int *cuts, int *p)
{
    bal_exact_chain c[BAL_EXACT_OUT];
    *p = 0;
    if (m < 1 || data_owner >= pb->n_dev ||
        bal_exact_chains(pb, m, schedule, data_owner < 0 ? -1 : data_owner, NULL, 0, c) == 0)
        return INFINITY;
    *p = c[0].p;
    memcpy(order, c[0].order, (size_t)c[0].p * sizeof(int));
    memcpy(cuts, c[0].cuts, ((size_t)c[0].p + 1) * sizeof(int));
    return c[0].cycle;
}
