/* coord_plan.c - the planning driver (coord_plan.h): the balancer on the
 * candidates' measured profiles and links, the plan devices get, signed
 * with the coordinator's key. Runs off the job manager's lock. */
#include "coord_plan.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bal.h"
#include "cert.h"
#include "sl_log.h"
#include "sl_mem.h"
#include "sl_time.h"

static char *path_of(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = sl_xmalloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median bandwidth and one-way latency of the measured links between two
 * sets of sites (a == b: inside site a); 0 when none was measured. */
static int link_median(json_t **res, char (*sites)[CERT_SITE_MAX + 1], char (*ids)[CERT_ID_LEN],
                       int n, const char *a, const char *b, double *bw, double *lat)
{
    double *vb = sl_xmalloc((size_t)n * n * sizeof *vb), *vl = sl_xmalloc((size_t)n * n * sizeof *vl);
    int k = 0;
    for (int i = 0; i < n; i++) {
        json_t *links = json_object_get(res[i], "links");
        size_t x;
        json_t *l;
        json_array_foreach(links, x, l) {
            const char *peer = json_string_value(json_object_get(l, "peer"));
            int q = -1;
            for (int t = 0; peer && t < n; t++)
                if (!strcmp(ids[t], peer))
                    q = t;
            if (q < 0 || q == i)
                continue;
            int match = (!strcmp(sites[i], a) && !strcmp(sites[q], b)) ||
                        (!strcmp(sites[i], b) && !strcmp(sites[q], a));
            double rtt = json_number_value(json_object_get(l, "rtt_s"));
            double w = json_number_value(json_object_get(l, "bandwidth_Bps"));
            if (match && rtt > 0 && w > 0) {
                vb[k] = w;
                vl[k++] = rtt / 2;
            }
        }
    }
    if (k) {
        qsort(vb, (size_t)k, sizeof *vb, cmp_d);
        qsort(vl, (size_t)k, sizeof *vl, cmp_d);
        *bw = vb[k / 2];
        *lat = vl[k / 2];
    }
    free(vb);
    free(vl);
    return k;
}

static json_t *link_json(double bw, double lat)
{
    return json_pack("{s:f, s:f}", "bandwidth_gbps", bw * 8 / 1e9, "latency_ms",
                     lat * 1e3 < 1e-6 ? 1e-6 : lat * 1e3);
}

/* Everything planning needs, copied out of the job under the lock. */
struct coord_plan_in {
    char id[COORD_JOB_ID_LEN];
    uint64_t num;
    int epoch, start_step;
    char *config;
    coord_jobopts opts;
    int nowner;
    char owner[COORD_MAX_OWNERS][CERT_ID_LEN], dataset[COORD_MAX_OWNERS][65];
    int obatch[COORD_MAX_OWNERS];
    int away[COORD_MAX_OWNERS], rejoin[COORD_MAX_OWNERS]; /* outer:H: owners left out, back */
    int away_since[COORD_MAX_OWNERS];
    int seq, n;
    char (*ids)[CERT_ID_LEN];
    char (*sites)[CERT_SITE_MAX + 1];
    json_t **res;
    coord_dev *dev;
    /* Where the links come from: every candidate that reported a profile,
     * planned or not. A pair of sites is measured by one device; when it is
     * gone, its measurements still describe the sites' network. */
    int nl;
    char (*lids)[CERT_ID_LEN];
    char (*lsites)[CERT_SITE_MAX + 1];
    json_t **lres;
};
typedef struct coord_plan_in plan_in;

/* The pairs of sites (a site with itself where it has two candidates) that
 * the profiles measured no link between, as "a-b, c-c" into out; the plan
 * assumes the balancer's defaults for them. */
static void unmeasured_links(const plan_in *in, char *out, size_t cap)
{
    out[0] = 0;
    double bw, lat;
    for (int i = 0; i < in->n; i++) {
        int first_i = 1, count_i = 0;
        for (int x = 0; x < in->n; x++) {
            first_i &= x >= i || strcmp(in->sites[x], in->sites[i]) != 0;
            count_i += !strcmp(in->sites[x], in->sites[i]);
        }
        for (int k = i; k < in->n && first_i; k++) {
            int first_k = 1;
            for (int x = 0; x < k; x++)
                first_k &= strcmp(in->sites[x], in->sites[k]) != 0;
            int same = k == i;
            if (!(same ? count_i >= 2 : first_k && strcmp(in->sites[i], in->sites[k])))
                continue;
            if (!link_median(in->lres, in->lsites, in->lids, in->nl, in->sites[i], in->sites[k],
                             &bw, &lat)) {
                size_t o = strlen(out);
                if (o + 1 < cap)
                    snprintf(out + o, cap - o, "%s%s-%s", o ? ", " : "", in->sites[i], in->sites[k]);
            }
        }
    }
}

void coord_plan_in_free(plan_in *in)
{
    if (!in)
        return;
    free(in->config);
    coord_jobopts_free(&in->opts);
    free(in->ids);
    free(in->sites);
    for (int i = 0; i < in->n; i++)
        json_decref(in->res[i]);
    free(in->res);
    free(in->dev);
    free(in->lids);
    free(in->lsites);
    for (int i = 0; i < in->nl; i++)
        json_decref(in->lres[i]);
    free(in->lres);
    free(in);
}

/* A profile's cpu pool into the balancer's device d, if it is well formed.
 * A device cannot make planning fail with it: a malformed pool is left out,
 * and a pool's size is what its first device said. */
static void pool_of(json_t *devs, json_t *cp, json_t *d)
{
    const char *name = json_string_value(json_object_get(cp, "name"));
    double cpus = json_number_value(json_object_get(cp, "cpus"));
    double size = json_number_value(json_object_get(cp, "pool_cpus"));
    if (!name || !*name || strlen(name) >= BAL_NAME_MAX || !(cpus >= 1e-3 && cpus <= 1e6) ||
        !(size >= 1e-3 && size <= 1e6))
        return;
    const char *ns = json_string_value(json_object_get(cp, "net_ns"));
    for (const char *c = name; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            return;
    int ns_ok = ns && *ns && strlen(ns) < BAL_NAME_MAX;
    for (const char *c = ns; ns_ok && *c; c++)
        ns_ok = (unsigned char)*c >= 0x20 && *c != 0x7f;
    size_t k;
    json_t *o;
    json_array_foreach(devs, k, o) {
        const char *other = json_string_value(json_object_get(o, "cpu_pool"));
        if (other && !strcmp(other, name)) {
            size = json_number_value(json_object_get(o, "pool_cpus"));
            break;
        }
    }
    json_object_set_new(d, "cpu_pool", json_string(name));
    json_object_set_new(d, "pool_cpus", json_real(size));
    json_object_set_new(d, "cpus", json_real(cpus));
    if (ns_ok)
        json_object_set_new(d, "net_ns", json_string(ns));
}

/* Bytes a codec puts on the wire per byte of an fp32 tensor in rows of
 * `hidden` (bal_codec_cost; device/wire/dev_codec.h). Frame headers, tags
 * and the valid masks beside the activations are left out (under 1% here).
 * The options were checked at submit: an unknown codec sends fp32. */
static double wire_ratio(const char *codec, int hidden)
{
    bal_codec c;
    return codec && !bal_codec_cost(codec, hidden, &c, NULL) ? c.payload : 1;
}

/* The hidden size of pb's model at micro-batch bm: the embeddings' output
 * is the (bm x seq) x hidden fp32 activation. */
static int hidden_of(const bal_problem *pb, int bm, int seq)
{
    return (int)(bal_problem_unit(pb, 0)->out_bytes / (4 * (uint64_t)bm * (uint64_t)seq));
}

/* The balancer's inputs from the measured profiles. */
static bal_problem *problem_of(const plan_in *in, int bm, sl_err *err)
{
    json_t *devs = json_array();
    /* the units were timed at the largest replica's micro-batch: a smaller
     * one's take their share of it (the work of a unit is linear in it) */
    int pm = coord_jobopts_profile_micro(&in->opts);
    double x = pm > 0 ? (double)bm / pm : 1;
    for (int i = 0; i < in->n; i++) {
        json_t *r = in->res[i];
        json_t *f = json_object_get(r, "unit_fwd_s"), *b = json_object_get(r, "unit_bwd_s");
        size_t U = json_array_size(f);
        json_t *us = json_pack("{s:[f,f], s:[f,f], s:[f,f]}", "embeddings",
                               x * json_number_value(json_array_get(f, 0)),
                               x * json_number_value(json_array_get(b, 0)), "encoder",
                               x * json_number_value(json_array_get(f, 1)),
                               x * json_number_value(json_array_get(b, 1)), "head",
                               x * json_number_value(json_array_get(f, U - 1)),
                               x * json_number_value(json_array_get(b, U - 1)));
        json_t *d = json_pack("{s:s, s:s, s:s, s:I, s:o}", "id", in->ids[i], "site", in->sites[i],
                              "backend", in->dev[i].backend, "memory_bytes",
                              json_integer_value(json_object_get(r, "memory_bytes")),
                              "unit_seconds", us);
        /* the optimizer step as measured; a device that did not time it
         * gets the balancer's estimate */
        json_t *o = json_object_get(r, "unit_optim_s");
        if (json_array_size(o) == U && U >= 2)
            json_object_set_new(d, "optim_seconds",
                                json_pack("{s:f, s:f, s:f}", "embeddings",
                                          json_number_value(json_array_get(o, 0)), "encoder",
                                          json_number_value(json_array_get(o, 1)), "head",
                                          json_number_value(json_array_get(o, U - 1))));
        pool_of(devs, json_object_get(r, "cpu_pool"), d);
        json_array_append_new(devs, d);
    }
    json_t *dj = json_pack("{s:o}", "devices", devs), *net = json_object(), *sites = json_object(),
           *links = json_array();
    double bw, lat;
    for (int i = 0; i < in->n; i++) {
        const char *s = in->sites[i];
        if (!json_object_get(sites, s) &&
            link_median(in->lres, in->lsites, in->lids, in->nl, s, s, &bw, &lat))
            json_object_set_new(sites, s, link_json(bw, lat));
        for (int k = i + 1; k < in->n; k++) {
            const char *t = in->sites[k];
            int seen = !strcmp(s, t);
            for (size_t x = 0; !seen && x < json_array_size(links); x++) {
                json_t *l = json_array_get(links, x);
                const char *a = json_string_value(json_object_get(l, "a")),
                           *b = json_string_value(json_object_get(l, "b"));
                seen = (!strcmp(a, s) && !strcmp(b, t)) || (!strcmp(a, t) && !strcmp(b, s));
            }
            if (!seen && link_median(in->lres, in->lsites, in->lids, in->nl, s, t, &bw, &lat)) {
                json_t *l = link_json(bw, lat);
                json_object_set_new(l, "a", json_string(s));
                json_object_set_new(l, "b", json_string(t));
                json_array_append_new(links, l);
            }
        }
    }
    json_object_set_new(net, "sites", sites);
    json_object_set_new(net, "links", links);
    char *dt = json_dumps(dj, JSON_COMPACT), *nt = json_dumps(net, JSON_COMPACT);
    json_decref(dj);
    json_decref(net);
    bal_problem *pb = bal_problem_parse_task(coord_jobopts_task(&in->opts), in->config,
                                             "config.json", bm, in->seq, dt, "the profiled devices",
                                             nt, "the measured links", err);
    free(dt);
    free(nt);
    int hidden = pb ? hidden_of(pb, bm, in->seq) : 0;
    const char *ca = in->opts.codec_act, *cg = in->opts.codec_grad;
    if (pb && bal_problem_set_wire(pb, wire_ratio(ca, hidden), wire_ratio(cg, hidden), err)) {
        bal_problem_free(pb);
        return NULL;
    }
    return pb;
}

/* The planned devices' index of owner o, or -1. */
static int owner_index(const plan_in *in, int o)
{
    for (int i = 0; i < in->n; i++)
        if (!strcmp(in->ids[i], in->owner[o]))
            return i;
    return -1;
}

/* The plan devices get: who runs which units, where to reach them, with
 * which keys, codecs and options; the balancer's plan and prediction too. */
static char *plan_text(const plan_in *in, bal_plan *const *pls, bal_timeline *const *tls, int nrep,
                       const bal_fed_sync *sync)
{
    json_error_t je;
    json_t *cfg = json_loads(in->config, 0, &je), *stages = json_array(), *reps = json_array();
    json_t *bj = NULL;
    double slowest = 0;
    const bal_plan *pl0 = NULL;
    for (int r = 0; r < nrep; r++) {
        const bal_plan *pl = pls[r];
        if (!pl) { /* its owner is away: the replica has no stage */
            json_array_append_new(reps, json_pack("{s:s, s:s, s:i, s:i, s:i, s:b, s:i}", "owner",
                                                  in->owner[r], "dataset", in->dataset[r], "batch",
                                                  in->obatch[r], "first_stage",
                                                  (int)json_array_size(stages), "stages", 0,
                                                  "away", 1, "away_since", in->away_since[r]));
            continue;
        }
        json_t *bjr = bal_plan_json(pl, tls[r]), *bst = json_object_get(bjr, "stages");
        int first = (int)json_array_size(stages);
        for (int i = 0; i < pl->n_stages; i++) {
            const coord_dev *d = &in->dev[pl->stage[i].device];
            char hex[65];
            for (int k = 0; k < 32; k++)
                snprintf(hex + 2 * k, 3, "%02x", d->key[k]);
            json_t *b = json_array_get(bst, (size_t)i);
            json_t *st = json_pack("{s:i, s:s, s:s, s:O, s:O, s:i, s:s, s:i}", "index", first + i,
                                   "device", d->id, "address", d->address, "first_unit",
                                   json_object_get(b, "first_unit"), "last_unit",
                                   json_object_get(b, "last_unit"), "warmup", pl->stage[i].warmup,
                                   "link_key", hex, "threads", d->threads ? (int)d->threads : 1);
            if (nrep > 1)
                json_object_set_new(st, "replica", json_integer(r));
            json_array_append_new(stages, st);
        }
        double it = tls[r] ? tls[r]->iteration_s : pl->est_iter_s;
        slowest = it > slowest ? it : slowest;
        if (nrep > 1) {
            json_t *rj = json_pack("{s:s, s:s, s:i, s:i, s:i, s:f, s:O}", "owner", in->owner[r],
                                   "dataset", in->dataset[r], "batch", in->obatch[r],
                                   "first_stage", first, "stages", pl->n_stages,
                                   "predicted_iteration_s", it, "balancer", bjr);
            if (in->rejoin[r])
                json_object_set_new(rj, "rejoin", json_true());
            json_array_append_new(reps, rj);
        }
        if (!pl0) {
            pl0 = pl;
            bj = bjr;
        } else {
            json_decref(bjr);
        }
    }
    const bal_plan *pl = pl0;
    const coord_jobopts *o = &in->opts;
    json_t *plan = json_pack(
        "{s:s, s:I, s:i, s:o, s:{s:s, s:s}, s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:s, s:s, s:b, "
        "s:o, s:f, s:o}",
        "job", in->id, "job_num", (json_int_t)in->num, "epoch", in->epoch, "config", cfg, "data",
        "owner", in->owner[0], "dataset", in->dataset[0], "batch", o->batch, "seq", in->seq,
        "micro_batches", pl->micro_batches, "schedule", bal_schedule_name(pl->schedule), "steps",
        o->steps, "start_step", in->start_step, "checkpoint_every", o->checkpoint_every,
        "codec_act", o->codec_act, "codec_grad", o->codec_grad, "sealed", o->sealed, "stages",
        stages, "predicted_iteration_s",
        nrep > 1 ? slowest + sync->round_s / (o->sync_every ? o->sync_every : 1) : slowest,
        "balancer", bj);
    json_object_set_new(plan, "options", coord_jobopts_json(o));
    if (nrep > 1) {
        json_object_set_new(plan, "replicas", reps);
        /* the prediction: the slowest replica's iteration plus a sync round
         * every `every` steps (bal_fed_sync_round) */
        json_object_set_new(plan, "sync", json_pack("{s:s, s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f}",
                                                    "mode", o->sync_every ? "outer" : "step",
                                                    "every", o->sync_every ? o->sync_every : 1,
                                                    "codec", o->codec_sync, "outer_lr",
                                                    o->outer_lr, "outer_momentum",
                                                    o->outer_momentum, "predicted_round_s",
                                                    sync->round_s, "round_link_s", sync->link_s,
                                                    "round_cpu_s", sync->cpu_s, "round_bytes",
                                                    sync->bytes, "slowest_replica_s", slowest));
    } else {
        json_decref(reps);
    }
    char *text = json_dumps(plan, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(plan);
    return text;
}

/* Plans a job (no lock held): the balancer on the measured devices and
 * links, the data owner first. Returns the signed plan text or NULL with
 * the reason. */
static char *plan_job(const char *pki, plan_in *in, uint8_t **sig, size_t *sig_len, sl_err *err)
{
    int m = in->opts.micro_batches, R = in->nowner;
    bal_opts bo = bal_opts_default();
    bo.micro_batches = m;
    bo.schedule = bal_schedule_parse(in->opts.schedule);
    int algo = bal_algo_parse(in->opts.algo);
    bal_problem *pb[COORD_MAX_OWNERS] = {0};
    bal_plan *pl[COORD_MAX_OWNERS] = {0};
    bal_timeline *tl[COORD_MAX_OWNERS] = {0};
    int owner[COORD_MAX_OWNERS], home[COORD_MAX_OWNERS], rc = 0;
    bal_codec sc = {0}; /* a federation's sync codec */
    char *text = NULL, why[300];
    /* every owner profiled, its policy kept; its replica's model at its own
     * micro-batch */
    for (int r = 0; !rc && r < R; r++) {
        if (in->away[r])
            continue;
        owner[r] = owner_index(in, r);
        const coord_policy *pol = owner[r] < 0 ? NULL : &in->dev[owner[r]].policy;
        if (owner[r] < 0)
            rc = sl_err_set(err, SL_ESTATE, "the data owner %s did not report a profile",
                            in->owner[r]);
        else if (coord_policy_check(pol, &in->opts, why, sizeof why))
            rc = sl_err_set(err, SL_EAUTH, "%s (owner %s)", why, in->owner[r]);
        else if (!(pb[r] = problem_of(in, in->obatch[r] / m, err)))
            rc = -1;
        else
            home[r] = pol->known ? pol->home_layers : 0;
    }
    if (!rc && R == 1) {
        if (in->opts.u_shape)
            bo.data_owner = owner[0];
        else
            bo.first_device = owner[0]; /* its tokens stay home: it holds unit 0 */
        pl[0] = bal_plan_make_home(pb[0], algo, &bo, home[0], err);
        rc = pl[0] ? 0 : -1;
    } else if (!rc) {
        /* the replicas present, in order (an owner away has none) */
        int at[COORD_MAX_OWNERS], Rp = 0, powner[COORD_MAX_OWNERS], phome[COORD_MAX_OWNERS];
        bal_problem *ppb[COORD_MAX_OWNERS];
        for (int r = 0; r < R; r++)
            if (!in->away[r]) {
                at[Rp] = r;
                ppb[Rp] = pb[r];
                powner[Rp] = owner[r];
                phome[Rp++] = home[r];
            }
        /* the sync round, which the placement weighs and the prediction adds */
        bal_fed_in fi = {.R = Rp, .pb = (const bal_problem *const *)ppb, .owner = powner,
                         .home = phome, .opts = bo, .ushaped = in->opts.u_shape, .algo = algo,
                         .sync_codec = &sc, .sync_every = in->opts.sync_every};
        int bad = Rp && bal_codec_cost(in->opts.codec_sync,
                                       hidden_of(ppb[0], in->obatch[at[0]] / m, in->seq), &sc, err);
        bal_fed *f = !Rp || bad                           ? NULL
                     : strcmp(in->opts.placement, "equal") ? bal_fed_place(&fi, err)
                                                           : bal_fed_even(&fi, err);
        if (!Rp)
            sl_err_set(err, SL_ESTATE, "every data owner is away");
        rc = f ? 0 : -1;
        for (int k = 0; f && k < Rp; k++) {
            pl[at[k]] = f->plan[k];
            f->plan[k] = NULL;
        }
        bal_fed_free(f);
    }
    for (int r = 0; !rc && r < R; r++) {
        if (in->away[r])
            continue;
        if (pl[r]->stage[0].device != owner[r])
            rc = sl_err_set(err, SL_ESTATE, "the plan does not start at the data owner %s",
                            in->owner[r]);
        else if (!(tl[r] = bal_simulate(pl[r], pl[r]->schedule, 0, err)))
            rc = -1;
    }
    bal_fed_sync sync = {0};
    if (!rc && R > 1) {
        /* the replicas present exchange each unit's parameters' worth in the
         * sync's codec (an owner away has no plan) */
        const bal_plan *present[COORD_MAX_OWNERS];
        int np = 0, first = -1;
        for (int r = 0; r < R; r++)
            if (pl[r]) {
                present[np++] = pl[r];
                first = first < 0 ? r : first;
            }
        rc = bal_fed_sync_round(pb[first], present, np, &sc, &sync, err);
    }
    if (!rc)
        text = plan_text(in, pl, tl, R, &sync);
    if (text) {
        char *key = path_of(pki, "coordinator.key");
        if (cert_sign_data(key, text, strlen(text), sig, sig_len, err)) {
            free(text);
            text = NULL;
        }
        free(key);
    }
    for (int r = 0; r < R; r++) {
        bal_timeline_free(tl[r]);
        bal_plan_free(pl[r]);
        bal_problem_free(pb[r]);
    }
    return text;
}

/* Takes the plan: its stages' devices, the step accumulators. */
plan_in *coord_plan_in_of(const coord_job *jb, const coord_devs *devs, int replan, int64_t now_s)
{
    plan_in *in = sl_xcalloc(1, sizeof *in);
    snprintf(in->id, sizeof in->id, "%s", jb->id);
    in->num = jb->num;
    in->epoch = jb->epoch + 1;
    in->start_step = jb->committed + 1;
    in->config = sl_xstrdup(jb->config);
    coord_jobopts_copy(&in->opts, &jb->opts);
    in->nowner = jb->nowner;
    for (int o = 0; o < jb->nowner; o++) {
        snprintf(in->owner[o], sizeof in->owner[o], "%s", jb->owner[o].id);
        snprintf(in->dataset[o], sizeof in->dataset[o], "%s", jb->owner[o].dataset);
        in->obatch[o] = jb->owner[o].batch;
        in->away[o] = replan && jb->plan_away[o];
        in->rejoin[o] = replan && jb->plan_rejoin[o];
        in->away_since[o] = jb->plan_away_since[o];
    }
    in->seq = jb->seq;
    size_t n = (size_t)jb->ncand + 1;
    in->ids = sl_xcalloc(n, sizeof *in->ids);
    in->sites = sl_xcalloc(n, sizeof *in->sites);
    in->res = sl_xcalloc(n, sizeof *in->res);
    in->dev = sl_xcalloc(n, sizeof *in->dev);
    in->lids = sl_xcalloc(n, sizeof *in->lids);
    in->lsites = sl_xcalloc(n, sizeof *in->lsites);
    in->lres = sl_xcalloc(n, sizeof *in->lres);
    for (int i = 0; i < jb->ncand; i++) {
        const coord_cand *c = &jb->cand[i];
        const coord_dev *d = coord_devs_find(devs, c->id);
        json_error_t je;
        json_t *r = c->result && !c->failed ? json_loads(c->result, 0, &je) : NULL;
        if (!r)
            continue;
        snprintf(in->lids[in->nl], CERT_ID_LEN, "%s", c->id);
        in->lres[in->nl++] = json_incref(r);
        if (!d || (replan && !coord_job_cand_usable(jb, i, devs, now_s))) {
            json_decref(r);
            continue;
        }
        snprintf(in->ids[in->n], CERT_ID_LEN, "%s", c->id);
        in->res[in->n] = r;
        in->dev[in->n] = *d;
        in->dev[in->n].datasets = NULL;
        in->dev[in->n].n_datasets = 0;
        in->n++;
    }
    return in;
}

/* The sites of in's devices from the registry: one read for the link
 * sources; the planned devices are among them, in the same order. */
static int plan_in_sites(coord_jobstore *store, plan_in *in, sl_err *err)
{
    if (coord_jobstore_sites(store, in->lids, in->lsites, in->nl, err))
        return -1;
    for (int i = 0, k = 0; i < in->n; i++, k++) {
        while (k < in->nl && strcmp(in->lids[k], in->ids[i]))
            k++;
        if (k < in->nl)
            memcpy(in->sites[i], in->lsites[k], sizeof in->sites[i]);
    }
    return 0;
}

int coord_plan_read(char *text, uint8_t *sig, size_t sig_len, coord_job_plan *pl, sl_err *err)
{
    memset(pl, 0, sizeof *pl);
    json_error_t je;
    json_t *pj = json_loads(text, 0, &je);
    json_t *st = json_object_get(pj, "stages");
    int p = (int)json_array_size(st);
    if (!pj || p < 1) {
        json_decref(pj);
        free(text);
        free(sig);
        return sl_err_set(err, SL_EINTERNAL, "the plan has no stages");
    }
    pl->text = text;
    pl->sig = sig;
    pl->sig_len = sig_len;
    pl->p = p;
    pl->stage_dev = sl_xcalloc((size_t)p, sizeof *pl->stage_dev);
    pl->first_unit = sl_xcalloc((size_t)p, sizeof *pl->first_unit);
    pl->last_unit = sl_xcalloc((size_t)p, sizeof *pl->last_unit);
    for (int i = 0; i < p; i++) {
        json_t *si = json_array_get(st, (size_t)i);
        const char *d = json_string_value(json_object_get(si, "device"));
        snprintf(pl->stage_dev[i], CERT_ID_LEN, "%s", d ? d : "");
        pl->first_unit[i] = (int)json_integer_value(json_object_get(si, "first_unit"));
        pl->last_unit[i] = (int)json_integer_value(json_object_get(si, "last_unit"));
        /* replicas: their stages follow each other, replica by replica */
        json_t *rj = json_object_get(si, "replica");
        int r = json_is_integer(rj) ? (int)json_integer_value(rj) : 0;
        if (r == pl->nrep && r < COORD_MAX_OWNERS) {
            pl->rep_first[r] = i;
            pl->nrep = r + 1;
        }
        int seen = 0;
        for (int k = 0; k < i; k++)
            seen |= !strcmp(pl->stage_dev[k], pl->stage_dev[i]);
        pl->ndev += !seen;
    }
    pl->rep_first[pl->nrep] = p;
    /* a federation's replicas as the plan lists them, those away (no
     * stage) included */
    json_t *reps = json_object_get(pj, "replicas");
    if (json_array_size(reps) >= 2 && json_array_size(reps) <= COORD_MAX_OWNERS) {
        pl->nrep = (int)json_array_size(reps);
        for (int r = 0; r < pl->nrep; r++) {
            json_t *rj = json_array_get(reps, (size_t)r);
            pl->rep_first[r] = (int)json_integer_value(json_object_get(rj, "first_stage"));
            pl->away[r] = json_is_true(json_object_get(rj, "away"));
            pl->rejoin[r] = json_is_true(json_object_get(rj, "rejoin"));
            pl->away_since[r] = (int)json_integer_value(json_object_get(rj, "away_since"));
        }
        pl->rep_first[pl->nrep] = p;
    }
    pl->start_step = (int)json_integer_value(json_object_get(pj, "start_step"));
    if (pl->nrep == 1)
        pl->nrep = 0; /* one owner: no replicas */
    pl->seq = (int)json_integer_value(json_object_get(pj, "seq"));
    pl->predicted = json_number_value(json_object_get(pj, "predicted_iteration_s"));
    json_decref(pj);
    return 0;
}

void coord_plan_make(plan_in *in, coord_jobstore *store, const char *pki, coord_plan_result *r)
{
    memset(r, 0, sizeof *r);
    r->n_devices = in->n;
    r->start_step = in->start_step;
    sl_err err = {0};
    uint8_t *sig = NULL;
    size_t sig_len = 0;
    char *text = NULL;
    double t0 = sl_now_s();
    if (!plan_in_sites(store, in, &err))
        text = plan_job(pki, in, &sig, &sig_len, &err);
    if (text)
        unmeasured_links(in, r->unmeasured, sizeof r->unmeasured);
    r->seconds = sl_now_s() - t0;
    if (text && coord_plan_read(text, sig, sig_len, &r->plan, &err))
        text = NULL; /* freed */
    if (text)
        r->ok = 1;
    else
        snprintf(r->why, sizeof r->why, "%s", err.msg);
}
