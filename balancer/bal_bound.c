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
 * and backward through the later ones, and m backwards follow, with the
 * forwards not done before it (at most k_i are, the micro-batches its
 * memory stashes):
 *     T >= S + R + (m - 1) b_i + opt_0,  S = sum_j t_j, R = sum_j rt_j,  (2)
 *     T >= S + R + (m - 1) b_i + (m - k_i) f_i + opt_0.                  (3)
 * A link sends its m activations one at a time, each in sa_l, and the last
 * one still goes forward through the later stages and back through all;
 * the same for its gradients (sg_l) the other way:
 *     T >= S + R + (m - 1) max(sa_l, sg_l) + opt_0.                       (4)
 * A stage j after link l that runs k_j forwards before its first backward
 * (k_j: the micro-batches its memory holds, or fewer) gets the k_j-th
 * activation no sooner than k_j - 1 serializations after the first, then
 * runs its other m - k_j forwards each beside a backward, and its last
 * forward's micro-batch still goes through the later stages and back:
 *     T >= S + R + (k_j - 1) sa_l + (m - k_j) t_j + opt_0.                (5)
 * Its first backward, after that k_j-th forward, comes before the first
 * gradient that link l carries back, and the m gradients go one at a time:
 *     T >= sum_{i<=j} t_i + sum_{i<j} rt_i + (k_j - 1) sa_l
 *          + (m - 1) sg_l + opt_0.                                        (6)
 * With t_j >= w_j / v_j (w: the FLOPs a stage holds, v: the device's best
 * FLOP/s over the units), b_j >= beta t_j, k_i f_i at most the forward time
 * the device's memory holds, and the links at least what joining the sites
 * the chain visits costs (round trips, the gather, the slowest link's
 * serialization, a crossing before every stage off the first site), the
 * most work a chain on a set of sites can cover
 * within c = T - opt has an upper bound: a greedy over the stage times
 * sorted longest first, then the set's devices fastest first each given
 * the most those times and its own caps allow (a stage is a run of whole
 * units), for each range of stage counts and of the slack (2) leaves; a
 * chain that visits each of several sites once also runs its last site's
 * stages after all the others, and one that visits a site again crosses
 * once more. The bound is the smallest c whose work covers the model, the
 * least over the sets of sites. */
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

/* Sites a chain may visit: a bit mask; past BOUND_SITE_SETS sites the
 * bound does not split by them (every chain may visit any site). */
#define BOUND_SITE_SETS 8

/* What the crossings between two sites of a set cost at least (all 0 when
 * no crossing is known to come before a stage: one site, or any sites):
 * one crossing's activation and gradient serializations and round trip;
 * the sites' cheapest spanning tree in round trips; and what one more
 * crossing adds to R and G in place of a link of either kind. */
typedef struct {
    double xs, xg, xrt;
    double tree_rt, more_rt, more_lat;
} bound_cross;

/* The least a chain of p stages, on devices of the sites in `sites` only,
 * spends on its links, for p = 1..k: in round trips (latency and
 * serialization both ways of the smallest boundary) and in the norm's
 * gather (both latencies of every link). A link inside a site (or a host)
 * costs at least the cheapest such link, one between sites the cheapest
 * of those. pre[p]: any such chain, which visits at least as many sites
 * as the fewest that hold its d devices (d = p, or p - 1 with a data
 * owner), so crosses at least that many less one; the first stages of a
 * chain are one of these. R[p] and G[p]: a chain that visits every site of
 * the set (s of them): its crossings join them all, so they cost at least
 * a spanning tree of the sites (weighted by the cheapest link either way
 * between two; the cheapest such tree), and the p - 1 - (s - 1) other
 * links at least the cheapest link of either kind; a U (a data owner)
 * returns to its owner's site, so over several sites one more of its links
 * crosses, at least the cheapest crossing; a chain of fewer than s devices
 * gets the bound of s (there is none). Not `exact`: any sites,
 * R[p] = pre[p] and G[p] the same count of links in latencies. Z[p]: the
 * least that the chain's slowest link serializes one message in one
 * direction (the activation forward or the gradient back): any link of the
 * set; over several sites, a crossing, and the crossings join them all, so
 * at least the bottleneck of the sites' spanning tree that has the
 * smallest one (each pair weighted by the cheaper way round). *cross:
 * the set's crossings (bound_cross). */
static void link_floor(const bal_problem *pb, int k, int owner, unsigned sites_in, int exact,
                       double *pre, double *R, double *G, double *Z, bound_cross *cross)
{
    int n = pb->n_units, D = pb->n_dev, ns = pb->n_sites;
    double bytes = INFINITY;
    for (int u = 0; u + 1 < n; u++)
        bytes = fmin(bytes, (double)pb->unit[u].out_bytes);
    double fwd = bytes * pb->wire_act, back = bytes * pb->wire_grad, sf, sr;
    int *count = sl_xcalloc((size_t)ns, sizeof(int)), hosts = 0;
    for (int d = 0; d < D; d++)
        if (!exact || sites_in >> pb->site_of[d] & 1) {
            count[pb->site_of[d]]++;
            hosts |= pb->host_of[d] >= 0 && pb->host_of[d] != d;
        }
    /* [0]: inside a site or a host, [1]: between sites; per pair of sites
     * (a < b) the cheaper way round */
    double rt[2] = {INFINITY, INFINITY}, lat[2] = {INFINITY, INFINITY}, ser[2] = {INFINITY, INFINITY};
    bound_cross cr = {INFINITY, INFINITY, INFINITY, 0, 0, 0};
    double *prt = NULL, *plat = NULL, *pser = NULL;
    if (exact) {
        prt = sl_xmalloc((size_t)ns * (size_t)ns * 3 * sizeof(double));
        plat = prt + ns * ns;
        pser = plat + ns * ns;
        for (int a = 0; a < ns * ns; a++)
            prt[a] = plat[a] = pser[a] = INFINITY;
    }
    if (hosts) {
        rt[0] = bal_round_trip(pb->same_host, pb->same_host, fwd, back, &sf, &sr);
        lat[0] = 2 * pb->same_host.lat;
        ser[0] = fmax(sf, sr);
    }
    int s_all = 0;
    for (int a = 0; a < ns; a++) {
        s_all += count[a] > 0;
        if (count[a] >= 2) {
            rt[0] = fmin(rt[0], bal_round_trip(pb->inside[a], pb->inside[a], fwd, back, &sf, &sr));
            lat[0] = fmin(lat[0], 2 * pb->inside[a].lat);
            ser[0] = fmin(ser[0], fmax(sf, sr));
        }
        for (int b = 0; b < ns; b++)
            if (b != a && count[a] && count[b]) {
                bal_link f = pb->between[(size_t)a * ns + b], r = pb->between[(size_t)b * ns + a];
                double x = bal_round_trip(f, r, fwd, back, &sf, &sr), y = f.lat + r.lat;
                double z = fmax(sf, sr); /* crossing from a to b */
                int lo = a < b ? a : b, hi = a < b ? b : a;
                rt[1] = fmin(rt[1], x);
                lat[1] = fmin(lat[1], y);
                ser[1] = fmin(ser[1], z);
                cr.xs = fmin(cr.xs, sf);
                cr.xg = fmin(cr.xg, sr);
                cr.xrt = fmin(cr.xrt, x);
                if (prt) {
                    prt[lo * ns + hi] = prt[hi * ns + lo] = fmin(prt[lo * ns + hi], x);
                    plat[lo * ns + hi] = plat[hi * ns + lo] = fmin(plat[lo * ns + hi], y);
                    pser[lo * ns + hi] = pser[hi * ns + lo] = fmin(pser[lo * ns + hi], z);
                }
            }
    }
    /* the sites' cheapest spanning trees, in round trips and in latencies,
     * and the least bottleneck of one in serializations (Prim: its tree of
     * the least sum has the least bottleneck too) */
    double tree[3] = {0, 0, 0};
    for (int g = 0; g < 3 && exact && s_all > 1; g++) {
        const double *w = g == 2 ? pser : g ? plat : prt;
        double *near = sl_xmalloc((size_t)ns * sizeof(double));
        int first = -1;
        for (int a = 0; a < ns; a++) {
            near[a] = INFINITY;
            if (count[a] && first < 0)
                first = a;
        }
        near[first] = -1; /* in the tree */
        for (int a = 0; a < ns; a++)
            if (count[a] && near[a] >= 0)
                near[a] = w[first * ns + a];
        for (int added = 1; added < s_all; added++) {
            int bj = -1;
            for (int a = 0; a < ns; a++)
                if (count[a] && near[a] >= 0 && (bj < 0 || near[a] < near[bj]))
                    bj = a;
            tree[g] = g == 2 ? fmax(tree[g], near[bj]) : tree[g] + near[bj];
            near[bj] = -1;
            for (int a = 0; a < ns; a++)
                if (count[a] && near[a] >= 0)
                    near[a] = fmin(near[a], w[bj * ns + a]);
        }
        free(near);
    }
    double other_rt = fmin(rt[0], rt[1]), other_lat = fmin(lat[0], lat[1]);
    if (exact && s_all > 1 && isfinite(tree[0]) && isfinite(rt[1]) && isfinite(lat[1])) {
        cr.tree_rt = tree[0];
        cr.more_rt = rt[1] - other_rt;
        cr.more_lat = lat[1] - other_lat;
    }
    double any_ser = fmin(ser[0], ser[1]);
    qsort(count, (size_t)ns, sizeof(int), cmp_int_desc);
    for (int p = 1, sites = 1, held = count[0]; p <= k; p++) {
        int devs = owner >= 0 && p > 1 ? p - 1 : p, links = p - 1;
        while (held < devs && sites < s_all)
            held += count[sites++];
        int x = sites - 1 < links ? sites - 1 : links; /* links between sites, at least */
        double g = INFINITY;
        pre[p] = INFINITY;
        for (int y = x; y <= links; y += links - x > 0 ? links - x : 1) { /* a cost is linear in y */
            double in = links - y > 0 ? (links - y) : 0, bt = y;
            pre[p] = fmin(pre[p], (in ? in * rt[0] : 0) + (bt ? bt * rt[1] : 0));
            g = fmin(g, (in ? in * lat[0] : 0) + (bt ? bt * lat[1] : 0));
        }
        if (!isfinite(pre[p]))
            pre[p] = g = 0; /* no such chain: nothing to add */
        Z[p] = p < 2 || !isfinite(any_ser) ? 0 : any_ser;
        if (!exact) { /* a chain that may visit any of the sites */
            R[p] = pre[p];
            G[p] = g;
            continue;
        }
        if (s_all > 1)
            Z[p] = isfinite(tree[2]) ? tree[2] : 0;
        /* a U leaves its owner's site and comes back: its crossings form a
         * closed walk over the sites, the tree and at least one more */
        int closed = owner >= 0 && s_all > 1, tree_links = s_all - 1 + closed;
        int over = links > tree_links ? links - tree_links : 0; /* links besides those */
        R[p] = tree[0] + (closed ? rt[1] : 0) + (over ? over * other_rt : 0);
        G[p] = tree[1] + (closed ? lat[1] : 0) + (over ? over * other_lat : 0);
        if (!isfinite(R[p]) || !isfinite(G[p]))
            R[p] = G[p] = 0;
    }
    if (!exact || s_all < 2 || !isfinite(cr.xs))
        cr.xs = cr.xg = cr.xrt = 0; /* no crossing known to come before a stage */
    *cross = cr;
    free(prt);
    free(count);
}

/* The slack sigma = c - G - R - S that (2) leaves, as theta = sigma / ((m -
 * 1) beta) (the largest stage time (2) allows), is bracketed on a fixed
 * geometric grid (ratio BOUND_RATIO, not relative to c, so that the work
 * below never shrinks as c grows and bisection is sound): BOUND_STEPS
 * brackets of BOUND_SPLIT grid steps each below the first grid point that
 * no theta reaches, each split into its grid steps where it covers, and
 * [0, the lowest] for the rest; stage counts in up to BOUND_GROUPS ranges.
 * Past BOUND_CAPPED devices the per-device caps below are left out (a
 * weaker bound, quadratic work saved). */
#define BOUND_RATIO 1.01
#define BOUND_SPLIT 3
#define BOUND_STEPS 115
#define BOUND_GROUPS 16
#define BOUND_CAPPED 256

/* A device of the relaxation: its index, its best FLOP/s, and the most
 * forward time it can hold in flight before a stage's first backward (its
 * memory over the smallest stash bytes per forward second of any unit;
 * INFINITY: no limit). */
typedef struct {
    int d;
    double v, hold;
} bound_dev;

static int cmp_dev_desc(const void *a, const void *b)
{
    return cmp_desc(&((const bound_dev *)a)->v, &((const bound_dev *)b)->v);
}

/* room[h][(d * nj + j - j0) * ROOM_KINDS + kind]: device d's most relaxed
 * stage time (FLOPs / v) of a stage whose real time is at most theta_j (h =
 * 0) or its cap under (2) and (3) with theta_j (h = 1), of each kind of run
 * (run_room), and room[2 + s] the same behind a crossing ((5), (6)) for the
 * serialization xs[s] and (6)'s room theta_ju[s]; NAN: not yet computed.
 * It depends on the device alone, so every set of sites shares it. */
enum { ROOM_INSIDE, ROOM_FIRST, ROOM_LAST, ROOM_KINDS };
enum { ROOM_SLOTS = 8 };
typedef struct {
    double *room[2 + ROOM_SLOTS];
    int j0, nj;
    double xs[ROOM_SLOTS]; /* the crossing's serialization room[2 + s] was computed with */
    int ju[ROOM_SLOTS];
} bound_rooms;

typedef struct {
    const bal_problem *pb;
    const bound_dev *dv; /* fastest first */
    int k, nd, m;        /* stages at most, devices (the owner twice), micro-batches */
    double beta, W;      /* least backward share, the model's FLOPs */
    const double *pre, *R, *G, *Z; /* link_floor */
    bound_cross cross;             /* link_floor */
    int ju;                        /* (6)'s room for a stage behind a crossing: theta_ju */
    unsigned present;              /* the sites of the devices, when `exact` (<= 8 sites) */
    double *q, *t, *cap, *a; /* scratch, nd + 1 each */
    bound_dev *others;       /* scratch, nd: the devices but a U's owner */
    double *caps;            /* scratch, nd * ROOM_KINDS: the case's caps per device */
    double *caps_x, *cap_k;  /* the same after a crossing ((5)), and those a check uses */
    double *cap_o;           /* scratch, 2 nd: covers_last_block's caps */
    int *use;                /* scratch, 2 nd */
    int owner;               /* the data owner (a U), or -1 */
    bound_rooms *rooms;
} bound_ctx;

/* A device's largest room of any kind of run. */
static double room_any(const double *room)
{
    return fmax(room[ROOM_INSIDE], fmax(room[ROOM_FIRST], room[ROOM_LAST]));
}

/* The micro-batches a stage of units s..e-1 on device d may hold in
 * flight: its memory beside their static bytes over their stash, at most
 * m. */
static int run_inflight(const bal_problem *pb, int d, int s, int e, int m)
{
    uint64_t st = pb->pstatic[e] - pb->pstatic[s], sh = pb->pstash[e] - pb->pstash[s];
    uint64_t mem = pb->dev[d].mem_bytes;
    if (st > mem)
        return 0;
    if (!sh || (mem - st) / sh >= (uint64_t)m)
        return m;
    return (int)((mem - st) / sh);
}

/* Whether a stage of units s..e-1 on device d fits within cap seconds,
 * holds one micro-batch, and, when a crossing that serializes each
 * activation in at least xs comes before it, keeps (5) within slack: a
 * stage longer than xs holding k micro-batches in flight adds (k - 1) xs +
 * (m - k) t. By (6) its warm-up also holds back the gradients' stream over
 * that crossing, so k - 1 <= (u - t) / xs, u being what (6) leaves for the
 * stage, its warm-up and the crossing's round trip. Each condition only
 * eases as the run shrinks. */
static int run_ok(const bal_problem *pb, int d, int s, int e, double cap, double xs, double slack,
                  int m, double u)
{
    double t = bal_time(pb, d, s, e);
    if (t > cap || !bal_fits(pb, d, s, e, 1))
        return 0;
    if (xs <= 0)
        return 1;
    if (t > u)
        return 0;
    if (t <= xs)
        return 1;
    int k = run_inflight(pb, d, s, e, m);
    double k6 = 1 + floor((u - t) / xs + 1e-9);
    if (k6 < k)
        k = (int)k6;
    return (k - 1) * xs + (m - k) * t <= slack;
}

/* The most FLOPs / v of any run of units that device d computes within
 * cap seconds and whose stash for one micro-batch fits its memory beside
 * their static bytes (and, with xs > 0, that keeps (5) and (6) within
 * slack and u): a stage time of at most cap is one of those (every stage
 * holds at least the micro-batch it computes). Per kind of run: one of
 * neither end unit (room[ROOM_INSIDE]), one that starts with unit 0
 * (ROOM_FIRST) and one that ends with the head (ROOM_LAST). A chain has
 * one stage of each end; the others are of the first kind. */
static void run_room(const bal_problem *pb, int d, double v, double cap, double xs, double slack,
                     int m, double u, double *room)
{
    int n = pb->n_units, s = 1;
    double best = 0, w = 0;
    for (int e = 2; e <= n - 1; e++) {
        w += pb->unit[e - 1].fwd_flops + pb->unit[e - 1].bwd_flops;
        while (s < e && !run_ok(pb, d, s, e, cap, xs, slack, m, u)) {
            w -= pb->unit[s].fwd_flops + pb->unit[s].bwd_flops;
            s++;
        }
        if (s < e)
            best = fmax(best, w);
    }
    room[ROOM_INSIDE] = best / v;
    w = 0;
    for (int e = 1; e <= n && run_ok(pb, d, 0, e, cap, xs, slack, m, u); e++)
        w += pb->unit[e - 1].fwd_flops + pb->unit[e - 1].bwd_flops;
    room[ROOM_FIRST] = w / v;
    w = 0;
    for (int b = n - 1; b >= 0 && run_ok(pb, d, b, n, cap, xs, slack, m, u); b--)
        w += pb->unit[b].fwd_flops + pb->unit[b].bwd_flops;
    room[ROOM_LAST] = w / v;
}

/* Device dv[i]'s most relaxed stage times whose real time is at most
 * theta_j (h = 0), or at most what (2) and (3) allow with theta_j, t <=
 * theta_j and t <= beta theta_j + hold / (m - 1) (h = 1), and that with a
 * crossing before it, (5) within the slack (m - 1) beta theta_j and (6)
 * within theta_ju (h = 2): runs of whole units of each kind, ROOM_KINDS of
 * them, into room (cached per device, for every set of sites, h = 2 in
 * ROOM_SLOTS slots, each for one crossing's serialization and one ju; a
 * later call may move the cache). */
static void dev_room(bound_ctx *x, int h, int i, int j, double *room)
{
    bound_rooms *r = x->rooms;
    size_t D = (size_t)x->pb->n_dev;
    if (j < r->j0 || j >= r->j0 + r->nj) { /* grow the caches to hold j */
        int lo = r->nj ? (j < r->j0 ? j - 32 : r->j0) : j - 64;
        int hi = r->nj ? (j >= r->j0 + r->nj ? j + 32 : r->j0 + r->nj) : j + 64;
        for (int g = 0; g < 2 + ROOM_SLOTS; g++) {
            double *grown = sl_xmalloc(D * (size_t)(hi - lo) * ROOM_KINDS * sizeof(double));
            for (size_t a = 0; a < D; a++)
                for (int b = lo; b < hi; b++)
                    for (int k = 0; k < ROOM_KINDS; k++)
                        grown[(a * (size_t)(hi - lo) + (size_t)(b - lo)) * ROOM_KINDS + k] =
                            b >= r->j0 && b < r->j0 + r->nj
                                ? r->room[g][(a * (size_t)r->nj + (size_t)(b - r->j0)) * ROOM_KINDS + k]
                                : NAN;
            free(r->room[g]);
            r->room[g] = grown;
        }
        r->j0 = lo;
        r->nj = hi - lo;
    }
    int slot = h;
    if (h == 2) {
        int s = (int)((unsigned)x->ju % ROOM_SLOTS);
        slot = 2 + s;
        if (r->xs[s] != x->cross.xs || r->ju[s] != x->ju) { /* another crossing: forget the last one's */
            for (size_t a = 0; a < D * (size_t)r->nj * ROOM_KINDS; a++)
                r->room[slot][a] = NAN;
            r->xs[s] = x->cross.xs;
            r->ju[s] = x->ju;
        }
    }
    const bound_dev *v = &x->dv[i];
    double *c = &r->room[slot][((size_t)v->d * (size_t)r->nj + (size_t)(j - r->j0)) * ROOM_KINDS];
    if (isnan(*c)) {
        double th = pow(BOUND_RATIO, j), cap = th;
        if (h && x->m > 1)
            cap = fmin(cap, x->beta * th + v->hold / (x->m - 1));
        if (h == 2)
            run_room(x->pb, v->d, v->v, cap, x->cross.xs, (x->m - 1) * x->beta * th, x->m,
                     pow(BOUND_RATIO, x->ju), c);
        else
            run_room(x->pb, v->d, v->v, cap, 0, 0, x->m, INFINITY, c);
    }
    for (int k = 0; k < ROOM_KINDS; k++)
        room[k] = c[k];
}

/* The most work the greedy covers: stages fastest first, each as long as
 * (1) allows ((c - P - R[i + 1]) / m after stages of P seconds, whose links
 * cost at least R[i + 1]), at most cap (and the i-th at most pos[i], when
 * not NULL), until the stages add up to s_max. The stage times go to t
 * (when not NULL), 0 past the last. */
static double greedy(const bound_dev *dv, int k, int m, const double *R, double c, double cap,
                     const double *pos, double s_max, double *t)
{
    double P = 0, w = 0;
    int i = 0;
    for (; i < k; i++) {
        if (isinf(dv[i].v))
            return INFINITY;
        double x = fmin(fmin((c - P - R[i + 1]) / m, pos ? fmin(cap, pos[i]) : cap), s_max - P);
        if (x <= 0)
            break;
        if (t)
            t[i] = x;
        w += dv[i].v * x;
        P += x;
    }
    for (; t && i < k; i++)
        t[i] = 0;
    return w;
}

/* The same under per-device caps: every stage time sorted in decreasing
 * order has its prefixes at most the greedy's (q[j]: the greedy's first j
 * stages, the j-th at most the j-th largest cap), and device i's stage
 * time is at most cap[i]. That set is a
 * polymatroid (a concave function of the count, met with a box), so the
 * most work is its greedy: devices fastest first, each given the most the
 * prefixes allow beside those before it. a[] holds the times given so far in
 * decreasing order; stops once the work reaches W. */
static double greedy_capped(const bound_dev *dv, int k, const double *q, const double *cap,
                            double *a, double W)
{
    double w = 0;
    int r = 0;
    for (int d = 0; d < k; d++) {
        /* the j + 1 largest with x among them: a[0..j-1] + x, unless x <= a[j] */
        double x = cap[d], P = 0;
        for (int j = 0; j <= r && x > 0; j++) {
            double room = q[j + 1] - P;
            if (j < r && a[j] > room)
                room = a[j];
            x = fmin(x, room);
            if (j < r)
                P += a[j];
        }
        if (x <= 0)
            continue;
        w += dv[d].v * x;
        if (w >= W)
            return w;
        int j = r++;
        for (; j > 0 && a[j - 1] < x; j--)
            a[j] = a[j - 1];
        a[j] = x;
    }
    return w;
}

/* The caps checks of a case whose prefixes are x->q: every stage but the
 * two holding an end unit is a run inside, and one device's cap raised by
 * r covers at most v r more; and with every cap that of any kind of run;
 * and a U's owner once. With first >= 0, the chain starts on site first
 * and every device elsewhere has its stages after a crossing (caps_x, (5)). */
static int covers_caps(bound_ctx *x, double cg, int first)
{
    int nd = x->nd, m = x->m;
    double more[2] = {0, 0};
    for (int i = 0; i < nd; i++) {
        double *r = x->cap_k + (size_t)i * ROOM_KINDS;
        const double *reg = x->caps + (size_t)i * ROOM_KINDS;
        for (int k = 0; k < ROOM_KINDS; k++)
            r[k] = reg[k];
        if (first >= 0 && x->pb->site_of[x->dv[i].d] != first) {
            const double *after = x->caps_x + (size_t)i * ROOM_KINDS;
            r[ROOM_INSIDE] = fmin(r[ROOM_INSIDE], after[ROOM_INSIDE]);
            r[ROOM_LAST] = fmin(r[ROOM_LAST], after[ROOM_LAST]);
            r[ROOM_FIRST] = 0; /* unit 0 is on the first site */
        }
        double in = r[ROOM_INSIDE];
        x->cap[i] = in;
        more[0] = fmax(more[0], x->dv[i].v * (r[ROOM_FIRST] - in));
        more[1] = fmax(more[1], x->dv[i].v * (r[ROOM_LAST] - in));
    }
    /* a run's FLOPs / v times v again may round below its FLOPs */
    double rest = x->W * (1 - 1e-12) - more[0] - more[1];
    if (rest > 0 && greedy_capped(x->dv, nd, x->q, x->cap, x->a, rest) < rest)
        return 0;
    for (int i = 0; i < nd; i++)
        x->cap[i] = room_any(x->cap_k + (size_t)i * ROOM_KINDS);
    if (greedy_capped(x->dv, nd, x->q, x->cap, x->a, x->W) < x->W * (1 - 1e-12))
        return 0;
    if (x->owner < 0)
        return 1;
    /* a U: its owner holds both end units and computes both its
     * stages, within cg / m by (1) over the device; every other stage
     * is a run inside, and those stages, a part of all of them, keep
     * to the prefixes q */
    double own = 0;
    int no = 0;
    for (int i = 0; i < nd; i++) {
        const double *r = x->cap_k + (size_t)i * ROOM_KINDS;
        if (x->dv[i].d == x->owner) {
            own = x->dv[i].v * fmin(cg / m, r[ROOM_FIRST] + r[ROOM_LAST]);
            continue;
        }
        x->others[no] = x->dv[i];
        x->cap[no++] = r[ROOM_INSIDE];
    }
    rest = x->W * (1 - 1e-12) - own;
    return rest <= 0 || greedy_capped(x->others, no, x->q, x->cap, x->a, rest) >= rest;
}

/* The most work of the devices use[i] with times at most cap[i] adding up
 * to budget: the fastest first. */
static double knapsack(const bound_dev *dv, int nd, const double *cap, const int *use, double budget)
{
    double w = 0;
    for (int i = 0; i < nd && budget > 0; i++)
        if (use[i] && cap[i] > 0) {
            double t = fmin(cap[i], budget);
            w += dv[i].v * t;
            budget -= t;
        }
    return w;
}

/* A chain that starts on site `first` and visits each site once ends with
 * the block of some other site: every stage there comes after every stage
 * elsewhere (y seconds) and after all the crossings (at least the tree's
 * round trips), so by (1) its real time is at most (cg - tree - y) / m.
 * The work is at most the most the other devices do in y (with unit 0's
 * gain) plus the most that site's devices do in s_max - y under that limit
 * (with the head's gain): over y on a grid, each interval judged by the
 * other devices at its upper end and the last block at its lower end
 * (one gains with y, the other loses). x->cap_k holds the caps of the
 * check for `first`. */
static int covers_last_block(bound_ctx *x, double cg, int first, double s_max)
{
    enum { STEPS = 64 };
    int nd = x->nd, m = x->m, ns = x->pb->n_sites;
    double *cap = x->cap_o, *capl = x->cap_o + nd;
    int *use = x->use, *last = x->use + nd;
    double gain0 = 0;
    for (int i = 0; i < nd; i++) {
        const double *r = x->cap_k + (size_t)i * ROOM_KINDS;
        cap[i] = r[ROOM_INSIDE];
        if (x->pb->site_of[x->dv[i].d] == first)
            gain0 = fmax(gain0, x->dv[i].v * (r[ROOM_FIRST] - r[ROOM_INSIDE]));
    }
    for (int tau = 0; tau < ns; tau++) {
        if (tau == first || !(x->present >> tau & 1))
            continue;
        for (int i = 0; i < nd; i++) {
            last[i] = x->pb->site_of[x->dv[i].d] == tau;
            use[i] = !last[i];
        }
        for (int g = 0; g < STEPS; g++) {
            double y0 = s_max * g / STEPS, y1 = s_max * (g + 1) / STEPS;
            double limit = (cg - x->cross.tree_rt - y0) / m, gain1 = 0;
            if (limit <= 0)
                break;
            int jl = (int)ceil(log(limit) / log(BOUND_RATIO));
            for (int i = 0; i < nd; i++) {
                capl[i] = 0;
                if (!last[i])
                    continue;
                double rl[ROOM_KINDS];
                const double *r = x->cap_k + (size_t)i * ROOM_KINDS;
                dev_room(x, 0, i, jl, rl);
                capl[i] = fmin(r[ROOM_INSIDE], rl[ROOM_INSIDE]);
                gain1 = fmax(gain1, x->dv[i].v * (fmin(r[ROOM_LAST], rl[ROOM_LAST]) - capl[i]));
            }
            double w = knapsack(x->dv, nd, cap, use, y1) + gain0 +
                       knapsack(x->dv, nd, capl, last, s_max - y0) + gain1;
            if (w >= x->W * (1 - 1e-12))
                return 1;
        }
    }
    return 0;
}

/* Whether the work a chain of the devices (fastest first) covers within c
 * under (1) to (4) may reach W, judged by an upper bound on it: a chain of
 * p in [pa, pb] stages whose theta lies in [ta, tb] (tb = theta_jb) has
 * every t <= tb by (2), t <= beta tb + hold / (m - 1) on its device by (3),
 * and t <= c / m (at most theta_jc) by (1), each a run of whole units; it
 * spends at least R[pa] on its links' round trips and G[pa] on the gather
 * (its first i + 1 stages at least pre[i + 1] on theirs), and its slowest
 * link serializes a message in at least Z[pa], so S <= c - G[pa] - R[pa] -
 * (m - 1) max(beta ta, Z[pa]) by (2) and (4). The greedy on the pb fastest
 * devices with those limits, (1) counted from c - G[pa], covers at least
 * its work; over several sites (5) caps the devices off its first site.
 * Without twice, a chain over several sites (no data owner) visits each
 * once, and its last site's block must cover its part too
 * (covers_last_block); with twice, it visits a site again and so crosses
 * once more than the sites' tree (R and G count that crossing, and p - 1
 * >= s). 1: covered; 2: only the last blocks failed; 0: not covered. */
static int covers_visits(bound_ctx *x, double c, int pa, int pb, double ta, int jb, int jc,
                         int twice)
{
    int nd = x->nd, m = x->m;
    const double *pre = x->pre, *R = x->R, *G = x->G, *Z = x->Z;
    double r_links = R[pa], g_links = G[pa];
    if (twice) { /* s crossings at least: p - 1 >= s links, one more crossing */
        int s = __builtin_popcount(x->present), p = pa > s + 1 ? pa : s + 1;
        if (p > pb)
            return 0;
        r_links = R[p] + x->cross.more_rt;
        g_links = G[p] + x->cross.more_lat;
    }
    double cg = c - g_links, tb = pow(BOUND_RATIO, jb);
    if (cg <= 0)
        return 0;
    double s_max = cg - r_links - (m > 1 ? (m - 1) * fmax(x->beta * ta, Z[pa]) : 0);
    if (s_max <= 0)
        return 0;
    if (greedy(x->dv, pb, m, pre, cg, tb, NULL, s_max, NULL) < x->W)
        return 0;
    if (nd > BOUND_CAPPED) /* the per-device caps left out */
        return 1;
    /* the i-th longest stage is at most the i-th largest cap */
    for (int i = 0; i < nd; i++) {
        double r1[ROOM_KINDS], *r = x->caps + (size_t)i * ROOM_KINDS;
        dev_room(x, 1, i, jb, r1);
        dev_room(x, 0, i, jc, r);
        for (int k = 0; k < ROOM_KINDS; k++)
            r[k] = fmin(r[k], r1[k]);
        x->a[i] = room_any(r);
    }
    qsort(x->a, (size_t)nd, sizeof(double), cmp_desc);
    greedy(x->dv, pb, m, pre, cg, tb, x->a, s_max, x->t);
    x->q[0] = 0;
    for (int i = 0; i < nd; i++)
        x->q[i + 1] = x->q[i] + (i < pb ? x->t[i] : 0);
    if (!covers_caps(x, cg, -1))
        return 0;
    if (x->cross.xs <= 0 || m < 2)
        return 1;
    /* over several sites, every stage off the first site comes after a
     * crossing: (5) and (6) cap it too; the chain starts on some site (a U
     * on its owner's). (6): the stage and the crossing's round trip (of
     * the stages and links up to it), its warm-up's serializations and the
     * gradients' m - 1 fit in cg, so t + (k - 1) xs <= u, u rounded up to
     * the grid so that the caps are computed once per grid point */
    double u = cg - (m - 1) * x->cross.xg - x->cross.xrt;
    if (u <= 0)
        return 0;
    x->ju = (int)ceil(log(u) / log(BOUND_RATIO));
    for (int i = 0; i < nd; i++)
        dev_room(x, 2, i, jb, x->caps_x + (size_t)i * ROOM_KINDS);
    int ns = x->pb->n_sites, blocks = 0;
    for (int sigma = 0; sigma < ns; sigma++) {
        if (x->owner >= 0 && sigma != x->pb->site_of[x->owner])
            continue;
        if (x->present >> sigma & 1 && covers_caps(x, cg, sigma)) {
            if (twice || x->owner >= 0 || covers_last_block(x, cg, sigma, s_max))
                return 1;
            blocks = 1;
        }
    }
    return blocks ? 2 : 0;
}

/* Whether a chain of p in [pa, pb] stages with theta in [ta, theta_jb]
 * may cover W within c: one that visits each site once (a block per site),
 * or, over several sites without a data owner, one that visits a site
 * again and so crosses once more than the tree. */
static int covers_case(bound_ctx *x, double c, int pa, int pb, double ta, int jb, int jc)
{
    int once = covers_visits(x, c, pa, pb, ta, jb, jc, 0);
    /* the other visits' checks have less room everywhere (a smaller c and
     * S, the same caps): they pass only where these failed at the blocks */
    return once == 1 || (once == 2 && covers_visits(x, c, pa, pb, ta, jb, jc, 1) == 1);
}

/* Whether some case covers W within c: stage counts in up to BOUND_GROUPS
 * ranges, theta in the brackets of every BOUND_SPLIT-th grid point below
 * the first at or above its largest value, then [0, the lowest]; a bracket
 * that covers is split into its BOUND_SPLIT brackets of the grid, and c is
 * covered when one of those does (each lies inside it, with a larger ta and
 * a smaller tb, so this is the finer grid's answer at the coarser one's
 * cost where nothing covers). */
static int covers(bound_ctx *x, double c)
{
    int k = x->k, m = x->m, groups = k < BOUND_GROUPS ? k : BOUND_GROUPS;
    /* theta = sigma / ((m - 1) beta) <= c / ((m - 1) beta); with m = 1 (or
     * beta = 0) (2) says nothing and theta is the largest stage time,
     * <= c / m by (1) */
    double top = m > 1 && x->beta > 0 ? c / ((m - 1) * x->beta) : c / m;
    /* grid points theta_j = BOUND_RATIO^j: j1 the first multiple of
     * BOUND_SPLIT at or above top, jc the first at or above c / m */
    int j1 = (int)ceil(log(top) / log(BOUND_RATIO));
    j1 += ((BOUND_SPLIT - j1 % BOUND_SPLIT) % BOUND_SPLIT);
    int jc = (int)ceil(log(c / m) / log(BOUND_RATIO));
    for (int g = 0; g < groups; g++) {
        int pa = 1 + (int)((long)k * g / groups), pb = (int)((long)k * (g + 1) / groups);
        for (int j = 0; j <= BOUND_STEPS; j++) {
            int jb = j1 - BOUND_SPLIT * j;
            if (j == BOUND_STEPS) {
                if (covers_case(x, c, pa, pb, 0, jb, jc))
                    return 1;
                continue;
            }
            if (!covers_case(x, c, pa, pb, pow(BOUND_RATIO, jb - BOUND_SPLIT), jb, jc))
                continue;
            for (int f = 0; f < BOUND_SPLIT; f++)
                if (covers_case(x, c, pa, pb, pow(BOUND_RATIO, jb - f - 1), jb - f, jc))
                    return 1;
        }
    }
    return 0;
}

/* The smallest c = T - opt that the chains visiting exactly the sites in
 * `sites` (and only their devices; every site when not `exact`) may reach,
 * or `below` when none reaches below it. all[d]: device d's relaxation. */
static double bound_sites(const bal_problem *pb, const bound_dev *all, bound_rooms *rooms, int m,
                          int data_owner, unsigned sites, int exact, double W, double beta,
                          double below)
{
    int n = pb->n_units, D = pb->n_dev;
    bound_dev *v = sl_xmalloc(((size_t)D + 1) * sizeof *v);
    int k = 0;
    for (int d = 0; d < D; d++) {
        if (exact && !(sites >> pb->site_of[d] & 1))
            continue;
        v[k++] = all[d];
        if (d == data_owner) /* the data owner runs two stages */
            v[k++] = all[d];
    }
    if (!k) { /* no devices: no chain */
        free(v);
        return below;
    }
    qsort(v, (size_t)k, sizeof *v, cmp_dev_desc);
    /* every stage holds a unit: at most n stages, on any nd of the devices
     * (the greedy alone takes the n fastest; with caps of their own any) */
    int nd = k;
    if (k > n)
        k = n;
    double lo = 0, hi = below;
    double *pre = sl_xmalloc(4 * ((size_t)k + 1) * sizeof(double)), *R = pre + k + 1, *G = R + k + 1;
    double *Z = G + k + 1;
    double *scratch = sl_xmalloc((6 * (size_t)nd + 4) * sizeof(double));
    int *use = sl_xmalloc(2 * (size_t)nd * sizeof(int));
    bound_dev *others = sl_xmalloc((size_t)nd * sizeof *others);
    double *caps = sl_xmalloc(3 * (size_t)nd * ROOM_KINDS * sizeof *caps);
    bound_cross cross;
    link_floor(pb, k, data_owner, sites, exact, pre, R, G, Z, &cross);
    unsigned present = 0;
    for (int i = 0; exact && i < nd; i++)
        present |= 1u << pb->site_of[v[i].d];
    bound_ctx x = {.pb = pb, .dv = v, .k = k, .nd = nd, .m = m, .beta = beta, .W = W, .pre = pre,
                   .R = R, .G = G, .Z = Z, .q = scratch, .t = scratch + nd + 1,
                   .cap = scratch + 2 * nd + 2, .a = scratch + 3 * nd + 3,
                   .cap_o = scratch + 4 * nd + 4, .use = use, .others = others, .caps = caps,
                   .caps_x = caps + (size_t)nd * ROOM_KINDS, .cap_k = caps + 2 * (size_t)nd * ROOM_KINDS,
                   .owner = data_owner, .rooms = rooms, .cross = cross, .present = present};
    if (W > 0 && !isinf(v[0].v)) {
        if (isinf(hi)) {
            hi = 1;
            while (!covers(&x, hi) && hi < 1e30)
                hi *= 2;
        } else if (!covers(&x, hi)) {
            lo = hi;
        }
        for (int it = 0; it < 200 && hi - lo > 1e-12 * hi; it++) {
            double mid = 0.5 * (lo + hi);
            if (covers(&x, mid))
                hi = mid;
            else
                lo = mid;
        }
    } else
        lo = 0;
    free(v);
    free(pre);
    free(scratch);
    free(others);
    free(caps);
    free(use);
    return lo;
}

double bal_lower_bound(const bal_problem *pb, int m, int data_owner)
{
    int n = pb->n_units, D = pb->n_dev, ns = pb->n_sites;
    if (m < 1 || data_owner >= D)
        return 0;
    double W = 0;
    for (int u = 0; u < n; u++)
        W += pb->unit[u].fwd_flops + pb->unit[u].bwd_flops;
    /* every stage's backward is at least this share of its time */
    double beta = 1;
    for (int d = 0; d < D; d++)
        for (int u = 0; u < n; u++) {
            double f = bal_unit_fwd_s(pb, d, u), b = bal_unit_bwd_s(pb, d, u);
            if (f + b > 0)
                beta = fmin(beta, b / (f + b));
        }
    /* each device's best FLOP/s over the units, so that every unit takes at
     * least its FLOPs / v there. A stage of units U holds at most mem /
     * stash(U) micro-batches, whose forwards take f(U) each: at most mem x
     * the largest f / stash of a unit there. */
    bound_dev *all = sl_xmalloc((size_t)D * sizeof *all);
    for (int d = 0; d < D; d++) {
        double s = 0, per = 0;
        for (int u = 0; u < n; u++) {
            double w = pb->unit[u].fwd_flops + pb->unit[u].bwd_flops, t = bal_time(pb, d, u, u + 1);
            if (w > 0)
                s = fmax(s, t > 0 ? w / t : INFINITY);
            double f = bal_unit_fwd_s(pb, d, u), sh = (double)pb->unit[u].stash_bytes;
            if (f > 0)
                per = fmax(per, sh > 0 ? f / sh : INFINITY);
        }
        all[d] = (bound_dev){d, s, (double)pb->dev[d].mem_bytes * per};
        if (isnan(all[d].hold))
            all[d].hold = 0; /* no memory: nothing held */
    }
    /* every plan visits some set of sites (the data owner's among them) and
     * computes on their devices only: the bound is the least over the sets,
     * all sites first (usually the least; the others then mostly take one
     * test to rule out) */
    bound_rooms rooms = {0};
    double c;
    if (ns <= BOUND_SITE_SETS) {
        unsigned every = (1u << ns) - 1;
        c = bound_sites(pb, all, &rooms, m, data_owner, every, 1, W, beta, INFINITY);
        for (unsigned set = every - 1; set > 0; set--)
            if (data_owner < 0 || set >> pb->site_of[data_owner] & 1)
                c = fmin(c, bound_sites(pb, all, &rooms, m, data_owner, set, 1, W, beta, c));
    } else {
        c = bound_sites(pb, all, &rooms, m, data_owner, 0, 0, W, beta, INFINITY);
    }
    free(all);
    for (int g = 0; g < 2 + ROOM_SLOTS; g++)
        free(rooms.room[g]);
    /* every stage steps its optimizer after the gather: the one holding unit
     * 0 and the one holding the head (the data owner holds both) */
    double opt0 = INFINITY, opth = INFINITY;
    for (int d = 0; d < D; d++)
        if (data_owner < 0 || d == data_owner) {
            opt0 = fmin(opt0, bal_optim_s(pb, d, 0, 0));
            opth = fmin(opth, bal_optim_s(pb, d, n - 1, n - 1));
        }
    return c + fmax(opt0, opth);
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

/* A stage's state in the critical path's sweep: its times, the forwards
 * and backwards it ran (the next one by bal_next_is_forward), when it and
 * its links are free. */
typedef struct cp_stage {
    double f, b, act_s, lat_s, grad_s, lat_up; /* grad_s, lat_up: the link to i - 1 */
    double av, fs, ls; /* stage free; its link down free; its link up free */
    int nf, nb, warm;
} cp_stage;

double bal_plan_critical_path(const bal_plan *pl)
{
    int p = pl->n_stages, m = pl->micro_batches;
    if (p < 1 || m < 1 || (double)p * m > 5e7)
        return 0;
    size_t P = (size_t)p, M = (size_t)m;
    /* arrival of each activation and gradient at each stage: written by
     * the neighbour that sends it, read once its nf or nb is past it */
    double *act = sl_xmalloc(2 * P * M * sizeof(double)), *grad = act + P * M;
    cp_stage *cs = sl_xmalloc(P * sizeof *cs);
    for (int i = 0; i < p; i++) {
        const bal_stage *st = &pl->stage[i], *up = i ? &pl->stage[i - 1] : st;
        cs[i] = (cp_stage){st->fwd_s, st->bwd_s, st->act_s, st->lat_s, up->grad_s, up->lat_s,
                           0, 0, 0, 0, 0, bal_warm_forwards(pl->schedule, p, i, m, st->warmup)};
    }
    /* activations flow down the chain and gradients up: sweep the stages
     * down and up in turn, each as far as its inputs allow */
    for (int progress = 1, down = 1; progress; down = !down) {
        progress = 0;
        for (int j = 0; j < p; j++) {
            int i = down ? j : p - 1 - j, first = i == 0, last = i + 1 == p;
            cp_stage *c = &cs[i];
            int nf = c->nf, nb = c->nb, warm = c->warm;
            double *ain = act + i * M, *gin = grad + i * M;
            double *aout = last ? gin : ain + M, *gout = first ? gin : gin - M;
            double av = c->av, fs = c->fs, ls = c->ls;
            /* activations that arrived (the stage before sent them), and
             * gradients (the stage after sent them; the last stage's own
             * forwards) */
            int na = first ? m : cs[i - 1].nf, ng = last ? m : cs[i + 1].nb;
            for (;;) {
                if (bal_next_is_forward(nf, nb, warm, m)) {
                    if (nf >= na)
                        break;
                    double in = first ? 0 : ain[nf];
                    av = (av > in ? av : in) + c->f;
                    if (last) { /* the loss: this stage's backward may start */
                        aout[nf] = av;
                    } else { /* the activation to i + 1 */
                        fs = (av > fs ? av : fs) + c->act_s;
                        aout[nf] = fs + c->lat_s;
                    }
                    nf++;
                } else if (nb < m) {
                    if (nb >= (last ? nf : ng))
                        break;
                    double in = gin[nb];
                    av = (av > in ? av : in) + c->b;
                    if (!first) { /* the gradient to i - 1 */
                        ls = (av > ls ? av : ls) + c->grad_s;
                        gout[nb] = ls + c->lat_up;
                    }
                    nb++;
                } else {
                    break;
                }
            }
            if (nf != c->nf || nb != c->nb) {
                progress = 1;
                c->nf = nf;
                c->nb = nb;
                c->av = av;
                c->fs = fs;
                c->ls = ls;
            }
        }
    }
    double drained = 0, gather = 0, opt = 0;
    int stuck = 0;
    for (int i = 0; i < p; i++) {
        stuck |= cs[i].nb < m;
        drained = fmax(drained, cs[i].av);
        opt = fmax(opt, pl->stage[i].optim_s);
        if (i + 1 < p)
            gather += 2 * pl->stage[i].lat_s;
    }
    free(cs);
    free(act);
    return stuck ? 0 : drained + gather + opt;
}
