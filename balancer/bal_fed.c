/* bal_fed.c - one replica per data owner: which devices serve which owner,
 * and each replica's plan (bal.h, "federation").
 *
 * The replicas of a synchronised job go at the pace of the slowest one, so
 * the placement minimises the largest simulated iteration. A replica's plan
 * over a set of devices is bal_plan_make_home's on that subset (which may
 * itself leave a device out); the placement decides the sets: greedily, the
 * slowest replica takes the free device that shortens it most, or one from
 * another replica when that lowers the larger of the two; it stops when no
 * such move shortens the slowest. Devices that would not help stay free.
 * With a sync codec the round weighs in: of the assignments that path
 * passes through, the one with the smallest slowest iteration plus its
 * share of the round is kept (a helper across a site link may shorten the
 * slowest replica and lengthen the round by more). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bal.h"
#include "bal_int.h"
#include "sl_mem.h"

bal_plan *bal_plan_make_home(const bal_problem *pb, int algo, const bal_opts *opts, int home,
                             sl_err *err)
{
    int layers = pb->n_units - 2;
    if (home > layers)
        home = layers;
    if (home <= 0)
        return bal_plan_make(pb, algo, opts, err);
    bal_problem *merged = bal_problem_merge_prefix(pb, home, err);
    bal_plan *pl = merged ? bal_plan_make(merged, algo, opts, err) : NULL;
    if (pl && bal_plan_expand_prefix(pl, pb, home, err)) {
        bal_plan_free(pl);
        pl = NULL;
    }
    bal_problem_free(merged);
    return pl;
}

/* Replica r's plan over the devices in `set` (flags over all devices), its
 * stages' device indices those of the whole problem; *iter_s its simulated
 * iteration (INFINITY and NULL when nothing fits). */
static bal_plan *replica_plan(const bal_fed_in *in, int r, const unsigned char *set, double *iter_s,
                              sl_err *err)
{
    const bal_problem *pb = in->pb[r];
    int D = pb->n_dev, *index = sl_xmalloc((size_t)D * sizeof *index), k = 0, owner = -1;
    for (int d = 0; d < D; d++)
        if (set[d]) {
            if (d == in->owner[r])
                owner = k;
            index[k++] = d;
        }
    *iter_s = INFINITY;
    bal_problem *sub = bal_problem_subset(pb, set, err);
    bal_opts o = in->opts;
    o.data_owner = in->ushaped ? owner : -1;
    o.first_device = in->ushaped ? -1 : owner;
    bal_plan *pl = sub ? bal_plan_make_home(sub, in->algo, &o, in->home ? in->home[r] : 0, err) : NULL;
    bal_timeline *tl = pl ? bal_simulate(pl, pl->schedule, 0, err) : NULL;
    if (tl) {
        *iter_s = tl->iteration_s;
        for (int i = 0; i < pl->n_stages; i++)
            pl->stage[i].device = index[pl->stage[i].device];
        for (int i = 0; i < pl->n_dropped; i++)
            pl->dropped[i].device = index[pl->dropped[i].device];
        if (pl->data_owner >= 0)
            pl->data_owner = index[pl->data_owner];
    } else {
        bal_plan_free(pl);
        pl = NULL;
    }
    bal_timeline_free(tl);
    bal_problem_free(sub);
    free(index);
    return pl;
}

static int check_in(const bal_fed_in *in, sl_err *err)
{
    if (in->R < 1 || in->R > BAL_FED_MAX_REPLICAS)
        return sl_err_set(err, SL_EINVAL, "%d replicas: 1..%d", in->R, BAL_FED_MAX_REPLICAS);
    int D = in->pb[0]->n_dev;
    for (int r = 0; r < in->R; r++) {
        const bal_problem *pb = in->pb[r];
        if (pb->n_dev != D || pb->n_units != in->pb[0]->n_units)
            return sl_err_set(err, SL_EINVAL, "replica %d: another set of devices or units", r);
        for (int d = 0; d < D; d++)
            if (strcmp(pb->dev[d].id, in->pb[0]->dev[d].id))
                return sl_err_set(err, SL_EINVAL, "replica %d: devices in another order", r);
        if (in->owner[r] < 0 || in->owner[r] >= D)
            return sl_err_set(err, SL_EINVAL, "replica %d: owner %d is not a device", r, in->owner[r]);
        for (int q = 0; q < r; q++)
            if (in->owner[q] == in->owner[r])
                return sl_err_set(err, SL_EINVAL, "device %s owns replicas %d and %d: a device "
                                  "serves one replica", pb->dev[in->owner[r]].id, q, r);
    }
    return 0;
}

static bal_fed *fed_new(const bal_fed_in *in)
{
    bal_fed *f = sl_xcalloc(1, sizeof *f);
    f->R = in->R;
    f->n_dev = in->pb[0]->n_dev;
    f->plan = sl_xcalloc((size_t)in->R, sizeof *f->plan);
    f->iter_s = sl_xcalloc((size_t)in->R, sizeof *f->iter_s);
    f->replica_of = sl_xmalloc((size_t)f->n_dev * sizeof *f->replica_of);
    for (int d = 0; d < f->n_dev; d++)
        f->replica_of[d] = -1;
    for (int r = 0; r < in->R; r++)
        f->replica_of[in->owner[r]] = r;
    return f;
}

/* Plans every replica over the devices replica_of gives it; fails when one
 * does not fit, naming it. */
static int plan_all(const bal_fed_in *in, bal_fed *f, sl_err *err)
{
    unsigned char *set = sl_xmalloc((size_t)f->n_dev);
    f->slowest_s = 0;
    for (int r = 0; r < f->R; r++) {
        for (int d = 0; d < f->n_dev; d++)
            set[d] = f->replica_of[d] == r;
        bal_plan_free(f->plan[r]);
        f->plan[r] = replica_plan(in, r, set, &f->iter_s[r], err);
        if (!f->plan[r]) {
            free(set);
            return sl_err_wrap(err, "the replica of %s", in->pb[r]->dev[in->owner[r]].id);
        }
        if (f->iter_s[r] > f->slowest_s)
            f->slowest_s = f->iter_s[r];
    }
    /* a device a replica's plan left out is free */
    for (int d = 0; d < f->n_dev; d++) {
        int r = f->replica_of[d], used = 0;
        for (int i = 0; r >= 0 && i < f->plan[r]->n_stages; i++)
            used |= f->plan[r]->stage[i].device == d;
        if (r >= 0 && !used)
            f->replica_of[d] = -1;
    }
    free(set);
    return 0;
}

static double time_with(const bal_fed_in *in, const int *of, int r, int add, int remove)
{
    int D = in->pb[0]->n_dev;
    unsigned char *set = sl_xmalloc((size_t)D);
    for (int d = 0; d < D; d++)
        set[d] = (of[d] == r || d == add) && d != remove;
    double t;
    bal_plan_free(replica_plan(in, r, set, &t, NULL));
    free(set);
    return t;
}

/* The placement's objective for the assignment `of` whose slowest replica
 * takes `slowest`: that plus its share of the sync round, when weighed. */
static double weighed(const bal_fed_in *in, const int *of, double slowest)
{
    if (!in->sync_codec || in->R < 2 || !isfinite(slowest))
        return slowest;
    int D = in->pb[0]->n_dev, R = in->R;
    unsigned char *set = sl_xmalloc((size_t)D);
    bal_plan *pl[BAL_FED_MAX_REPLICAS] = {0};
    double t, obj = INFINITY;
    int ok = 1;
    for (int r = 0; r < R && ok; r++) {
        for (int d = 0; d < D; d++)
            set[d] = of[d] == r;
        ok = (pl[r] = replica_plan(in, r, set, &t, NULL)) != NULL;
    }
    bal_fed_sync sy;
    if (ok && !bal_fed_sync_round(in->pb[0], (const bal_plan *const *)pl, R, in->sync_codec, &sy,
                                  NULL))
        obj = slowest + sy.round_s / (in->sync_every > 1 ? in->sync_every : 1);
    for (int r = 0; r < R; r++)
        bal_plan_free(pl[r]);
    free(set);
    return obj;
}

/* Moves devices into the slowest replica while that lowers the largest
 * time; of[] ends as the assignment on that path with the smallest
 * objective (weighed), which is returned. */
static double improve(const bal_fed_in *in, int *of)
{
    int D = in->pb[0]->n_dev, R = in->R;
    double *t = sl_xmalloc((size_t)R * sizeof *t);
    int *best_of = sl_xmalloc((size_t)D * sizeof *best_of);
    for (int r = 0; r < R; r++)
        t[r] = time_with(in, of, r, -1, -1);
    double worst = 0;
    for (int r = 0; r < R; r++)
        worst = t[r] > worst ? t[r] : worst;
    double best_obj = weighed(in, of, worst);
    memcpy(best_of, of, (size_t)D * sizeof *of);
    for (int round = 0; round < D * R + D; round++) {
        int slow = 0;
        for (int r = 1; r < R; r++)
            if (t[r] > t[slow])
                slow = r;
        double best = t[slow];
        int best_d = -1;
        /* a free device, or one another replica can spare */
        for (int d = 0; d < D; d++) {
            int from = of[d];
            if (from == slow || (from >= 0 && in->owner[from] == d))
                continue;
            double ts = time_with(in, of, slow, d, -1);
            double tf = from >= 0 && ts < best ? time_with(in, of, from, -1, d) : 0;
            double w = ts > tf ? ts : tf;
            if (w < best * (1 - 1e-9)) {
                best = w;
                best_d = d;
            }
        }
        if (best_d < 0)
            break;
        int from = of[best_d];
        of[best_d] = slow;
        t[slow] = time_with(in, of, slow, -1, -1);
        if (from >= 0)
            t[from] = time_with(in, of, from, -1, -1);
        worst = 0;
        for (int r = 0; r < R; r++)
            worst = t[r] > worst ? t[r] : worst;
        double obj = weighed(in, of, worst);
        if (obj < best_obj * (1 - 1e-9)) {
            best_obj = obj;
            memcpy(best_of, of, (size_t)D * sizeof *of);
        }
    }
    memcpy(of, best_of, (size_t)D * sizeof *of);
    free(best_of);
    free(t);
    return best_obj;
}

/* The equal share: devices that own no data dealt to the replicas in turn. */
static void deal(const bal_fed_in *in, int *of)
{
    int next = 0;
    for (int d = 0; d < in->pb[0]->n_dev; d++)
        if (of[d] < 0)
            of[d] = next++ % in->R;
}

bal_fed *bal_fed_place(const bal_fed_in *in, sl_err *err)
{
    if (check_in(in, err))
        return NULL;
    bal_fed *f = fed_new(in);
    /* from the owners alone and from the equal share: never worse than it */
    int D = f->n_dev, *dealt = sl_xmalloc((size_t)D * sizeof *dealt);
    memcpy(dealt, f->replica_of, (size_t)D * sizeof *dealt);
    deal(in, dealt);
    double alone = improve(in, f->replica_of), shared = improve(in, dealt);
    if (shared < alone)
        memcpy(f->replica_of, dealt, (size_t)D * sizeof *dealt);
    free(dealt);
    if (plan_all(in, f, err)) {
        bal_fed_free(f);
        return NULL;
    }
    return f;
}

bal_fed *bal_fed_even(const bal_fed_in *in, sl_err *err)
{
    if (check_in(in, err))
        return NULL;
    bal_fed *f = fed_new(in);
    deal(in, f->replica_of);
    if (plan_all(in, f, err)) {
        bal_fed_free(f);
        return NULL;
    }
    return f;
}

void bal_fed_free(bal_fed *f)
{
    if (!f)
        return;
    for (int r = 0; r < f->R; r++)
        bal_plan_free(f->plan[r]);
    free(f->plan);
    free(f->iter_s);
    free(f->replica_of);
    free(f);
}

/* Reference-core CPU of a sync round's parts, one thread of the build
 * machine: give and combine from bench_sync; a payload byte's send and
 * receive are half of bench_sync's seal+open plus bench_link's gRPC+TLS
 * send or receive for sealed frames (docs/balancer.md). */
static const struct {
    const char *name;
    double give_ns, combine_ns;
} codec_cpu[] = {
    {"none", 0.9, 1.8}, {"fp16", 6.0, 2.6}, {"bf16", 4.6, 1.7}, {"int8", 6.4, 1.9}, {"topk", 5.2, 1.5},
};
#define SEND_NS_PER_BYTE 1.2
#define RECV_NS_PER_BYTE 1.4

int bal_codec_cost(const char *name, int cols, bal_codec *out, sl_err *err)
{
    memset(out, 0, sizeof *out);
    const char *kind = name;
    char buf[16];
    if (!strncmp(name, "topk:", 5)) {
        char *end;
        double f = strtod(name + 5, &end);
        if (end == name + 5 || *end || !(f > 0 && f <= 1))
            return sl_err_set(err, SL_EINVAL, "codec '%s': topk:F needs 0 < F <= 1", name);
        out->payload = 2 * f;
        snprintf(buf, sizeof buf, "topk");
        kind = buf;
    } else if (!strcmp(name, "none")) {
        out->payload = 1;
    } else if (!strcmp(name, "fp16") || !strcmp(name, "bf16")) {
        out->payload = 0.5;
    } else if (!strcmp(name, "int8")) {
        out->payload = cols > 0 ? (4.0 + cols) / (4.0 * cols) : 0.25;
    } else {
        return sl_err_set(err, SL_EINVAL, "codec '%s': none, fp16, bf16, int8 or topk:F", name);
    }
    for (size_t i = 0; i < sizeof codec_cpu / sizeof codec_cpu[0]; i++)
        if (!strcmp(codec_cpu[i].name, kind)) {
            out->give_ns = codec_cpu[i].give_ns;
            out->combine_ns = codec_cpu[i].combine_ns;
        }
    out->send_ns = SEND_NS_PER_BYTE;
    out->recv_ns = RECV_NS_PER_BYTE;
    return 0;
}

/* The share of a reference core device d's CPU work runs at. */
static double core_share(const bal_problem *pb, int d)
{
    const bal_device *x = &pb->dev[d];
    double c = x->cpu_pool[0] && x->cpus > 0 ? x->cpus : 1;
    if (x->cpu_pool[0] && x->pool_cpus > 0 && c > x->pool_cpus)
        c = x->pool_cpus;
    return c < 1 ? c : 1;
}

int bal_fed_sync_round(const bal_problem *pb, const bal_plan *const *plan, int R,
                       const bal_codec *codec, bal_fed_sync *out, sl_err *err)
{
    memset(out, 0, sizeof *out);
    int U = pb->n_units, D = pb->n_dev;
    if (R < 1 || R > BAL_FED_MAX_REPLICAS || !codec || !(codec->payload >= 0) ||
        !(codec->give_ns >= 0) || !(codec->combine_ns >= 0) || !(codec->send_ns >= 0) ||
        !(codec->recv_ns >= 0))
        return sl_err_set(err, SL_EINVAL, "sync round: %d replicas, or a codec without costs", R);
    int *holder = sl_xmalloc((size_t)R * (size_t)U * sizeof *holder);
    for (int r = 0; r < R; r++) {
        const bal_plan *pl = plan[r];
        for (int u = 0; u < U; u++)
            holder[r * U + u] = -1;
        for (int i = 0; pl && i < pl->n_stages; i++)
            for (int u = pl->stage[i].first; u <= pl->stage[i].last && u < U; u++)
                if (pl->stage[i].device >= 0 && pl->stage[i].device < D)
                    holder[r * U + u] = pl->stage[i].device;
        for (int u = 0; u < U; u++)
            if (holder[r * U + u] < 0) {
                free(holder);
                return sl_err_set(err, SL_EINVAL, "sync round: replica %d's plan does not hold "
                                  "unit %d on a device of the problem", r, u);
            }
    }
    /* bytes per directed device pair; each device's CPU in reference ns */
    double *pair = sl_xcalloc((size_t)D * (size_t)D, sizeof *pair);
    double *cpu = sl_xcalloc((size_t)D, sizeof *cpu);
    for (int u = 0; u < U; u++) {
        double params = (double)pb->unit[u].param_bytes / 4;
        double b = (double)pb->unit[u].param_bytes * codec->payload;
        for (int r = 0; r < R; r++) {
            int g = holder[r * U + u], head = holder[r * U + U - 1];
            cpu[g] += params * (codec->give_ns + R * codec->combine_ns);
            if (u == 0 && head != g)
                cpu[head] += params * R * codec->combine_ns;
            for (int q = 0; q < R; q++) {
                if (q == r)
                    continue;
                int h = holder[q * U + u], qhead = holder[q * U + U - 1];
                pair[(size_t)g * D + h] += b;
                if (u == 0 && qhead != h)
                    pair[(size_t)g * D + qhead] += b;
            }
        }
    }
    for (size_t x = 0; x < (size_t)D * (size_t)D; x++) {
        cpu[x / (size_t)D] += pair[x] * codec->send_ns;
        cpu[x % (size_t)D] += pair[x] * codec->recv_ns;
    }
    for (int d = 0; d < D; d++) {
        double t = cpu[d] * 1e-9 / core_share(pb, d);
        out->cpu_s = t > out->cpu_s ? t : out->cpu_s;
    }
    free(cpu);
    /* flows between two sites share that direction's link: their bytes go
     * onto the first pair of devices with those two sites */
    int S = pb->n_sites;
    int *first = sl_xmalloc((size_t)S * (size_t)S * sizeof *first);
    for (int k = 0; k < S * S; k++)
        first[k] = -1;
    for (size_t x = 0; x < (size_t)D * (size_t)D; x++) {
        int a = (int)(x / (size_t)D), b = (int)(x % (size_t)D);
        int sa = pb->site_of[a], sb = pb->site_of[b];
        if (!pair[x] || sa == sb)
            continue;
        if (first[sa * S + sb] < 0) {
            first[sa * S + sb] = (int)x;
        } else {
            pair[first[sa * S + sb]] += pair[x];
            pair[x] = 0;
        }
    }
    free(first);
    for (size_t x = 0; x < (size_t)D * (size_t)D; x++) {
        if (!pair[x])
            continue;
        bal_link l = bal_problem_link(pb, (int)(x / (size_t)D), (int)(x % (size_t)D));
        double t = l.lat + pair[x] / l.bw;
        out->bytes += pair[x];
        out->link_s = t > out->link_s ? t : out->link_s;
    }
    out->round_s = out->link_s + out->cpu_s;
    free(pair);
    free(holder);
    return 0;
}
