/* bal_model.c - the cost model (BERT units) and the problem: devices' per-unit
 * times, memory prefixes and the network between devices. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bal_int.h"
#include "sl_mem.h"

const int bal_bert_min[7] = {1, 1, 1, 1, BAL_MIN_VOCAB, 1, 1};
const int bal_bert_max[7] = {BAL_MAX_HIDDEN, BAL_MAX_LAYERS, BAL_MAX_HEADS, BAL_MAX_INTERMEDIATE,
                             BAL_MAX_VOCAB, BAL_MAX_POS, BAL_MAX_TYPE_VOCAB};

/* Units of one BERT at micro-batch B x sequence T, N = B*T tokens (fp32).
 *   embeddings: word+position+type tables and a LayerNorm
 *   encoder:    QKV+O (4H^2), FFN (2HI), two LayerNorms; attention 2 x 2BT^2H
 *   head:       transform (H^2) + LayerNorm + decoder (HV) + softmax/cross-entropy;
 *               or, to classify, pooler (H^2) + tanh + classifier (HK) + cross-entropy
 * Backward costs twice the forward (two GEMMs per forward GEMM). The head's
 * decoder is tied to the word embeddings in Hugging Face BERT; a stage that
 * holds the head keeps its own copy, so it is counted on both. */
int bal_bert_check(const bal_bert *c, sl_err *err)
{
    static const char *const name[7] = {"hidden_size", "num_hidden_layers",
                                        "num_attention_heads", "intermediate_size", "vocab_size",
                                        "max_position_embeddings", "type_vocab_size"};
    const int v[7] = {c->hidden, c->layers, c->heads, c->intermediate, c->vocab, c->max_pos,
                      c->type_vocab};
    for (int i = 0; i < 7; i++)
        if (v[i] < bal_bert_min[i] || v[i] > bal_bert_max[i])
            return sl_err_set(err, SL_EINVAL, "BERT config: %s must be between %d and %d, got %d",
                              name[i], bal_bert_min[i], bal_bert_max[i], v[i]);
    if (c->hidden % c->heads)
        return sl_err_set(err, SL_EINVAL, "BERT config: hidden_size %d is not a multiple of "
                          "num_attention_heads %d", c->hidden, c->heads);
    if (c->task != BAL_TASK_MLM && c->task != BAL_TASK_CLASSIFY)
        return sl_err_set(err, SL_EINVAL, "BERT config: unknown task %d", c->task);
    if (c->task == BAL_TASK_CLASSIFY) {
        if (c->num_labels < 2 || c->num_labels > BAL_MAX_LABELS)
            return sl_err_set(err, SL_EINVAL, "BERT config: sequence classification needs "
                              "num_labels between 2 and %d, got %d", BAL_MAX_LABELS, c->num_labels);
        if (c->problem_type != BAL_PROBLEM_NONE && c->problem_type != BAL_PROBLEM_SINGLE_LABEL)
            return sl_err_set(err, SL_EINVAL, "BERT config: problem_type %s is not supported "
                              "(single_label_classification is)",
                              c->problem_type == BAL_PROBLEM_REGRESSION ? "regression"
                                                                         : "multi_label_classification");
        if (!(c->classifier_dropout >= 0 && c->classifier_dropout < 1))
            return sl_err_set(err, SL_EINVAL, "BERT config: classifier_dropout must be in [0, 1)");
    }
    return 0;
}

int bal_bert_units(const bal_bert *c, int batch, int seq, bal_unit **out, int *n_units, sl_err *err)
{
    if (bal_bert_check(c, err))
        return -1;
    if (batch <= 0 || batch > 65536 || seq <= 0 || seq > BAL_MAX_POS)
        return sl_err_set(err, SL_EINVAL, "micro-batch size and sequence length must be positive");
    if (seq > c->max_pos)
        return sl_err_set(err, SL_EINVAL, "sequence length %d exceeds max_position_embeddings %d",
                          seq, c->max_pos);
    double H = c->hidden, I = c->intermediate, V = c->vocab, A = c->heads;
    double B = batch, T = seq, N = B * T;
    int n = c->layers + 2;
    bal_unit *u = sl_xcalloc((size_t)n, sizeof *u);

    double pe = (V + c->max_pos + c->type_vocab) * H + 2 * H;
    u[0].kind = BAL_UNIT_EMBED;
    u[0].fwd_flops = 11 * N * H; /* three adds and a LayerNorm */
    u[0].bwd_flops = 2 * u[0].fwd_flops;
    u[0].param_bytes = (uint64_t)(4 * pe);
    u[0].out_bytes = (uint64_t)(4 * N * H);
    u[0].stash_bytes = (uint64_t)(4 * 2 * N * H + 8 * N);

    double pl = 4 * H * H + 2 * H * I + 9 * H + I;
    double fl = 2 * N * (4 * H * H + 2 * H * I) + 4 * B * T * T * H + 5 * B * A * T * T +
                20 * N * H + 8 * N * I;
    /* saved for backward, as a Skyloom stage keeps it (device/dev_stage.c,
     * dev_unit_cost_of): Q, K, V, the attention output, r1, r2 (6H), the
     * GELU input (I), the probabilities (A T^2) and two LayerNorms'
     * statistics; l1, gelu(h), the layer output and the dropout masks are
     * recomputed in backward */
    double sl = 4 * (N * (6 * H + I + 4) + B * A * T * T);
    for (int i = 1; i <= c->layers; i++) {
        u[i].kind = BAL_UNIT_ENCODER;
        u[i].fwd_flops = fl;
        u[i].bwd_flops = 2 * fl;
        u[i].param_bytes = (uint64_t)(4 * pl);
        u[i].out_bytes = (uint64_t)(4 * N * H);
        u[i].stash_bytes = (uint64_t)sl;
    }
    bal_unit *h = &u[n - 1];
    h->kind = BAL_UNIT_HEAD;
    if (c->task == BAL_TASK_CLASSIFY) {
        /* the pooler (dense + tanh) and the classifier at the [CLS] row of
         * each sequence, dropout between them, the cross-entropy over K
         * classes; a slot keeps the pooler's input, its output and the
         * dropped copy (3H), the probabilities (K) and the losses (1) per
         * sequence, as a Skyloom stage does (device/dev_stage.c) */
        double K = c->num_labels;
        h->fwd_flops = 2 * B * (H * H + H * K) + 10 * B * H + 10 * B * K;
        h->bwd_flops = 2 * h->fwd_flops;
        h->param_bytes = (uint64_t)(4 * (H * H + H + K * H + K));
        h->out_bytes = 0;
        h->stash_bytes = (uint64_t)(4 * B * (3 * H + K + 1) + 8 * B);
        for (int i = 0; i < n; i++)
            u[i].optim_bytes = 3 * u[i].param_bytes;
        *out = u;
        *n_units = n;
        return 0;
    }
    double ph = H * H + 3 * H + V * H + V;
    /* the head runs only at the masked positions (BAL_MASK_FRAC of the
     * tokens), as a Skyloom stage does */
    double M = BAL_MASK_FRAC * N;
    h->fwd_flops = 2 * M * (H * H + H * V) + 10 * M * H + 10 * M * V;
    h->bwd_flops = 2 * h->fwd_flops;
    h->param_bytes = (uint64_t)(4 * ph);
    h->out_bytes = 0;
    h->stash_bytes = (uint64_t)(4 * M * (4 * H + V + 4));
    for (int i = 0; i < n; i++)
        u[i].optim_bytes = 3 * u[i].param_bytes; /* AdamW m, v and the gradient */
    *out = u;
    *n_units = n;
    return 0;
}

bal_network bal_network_default(void)
{
    bal_network n;
    memset(&n, 0, sizeof n);
    n.same_host = (bal_link){200e9 / 8, 5e-6};
    n.inside_site = (bal_link){10e9 / 8, 1e-4};
    n.between_sites = (bal_link){1e9 / 8, 0.05};
    return n;
}

static int link_ok(bal_link l)
{
    return isfinite(l.bw) && l.bw > 0 && isfinite(l.lat) && l.lat >= 0;
}

static double pre_total(const double *tf, const double *tb, size_t n)
{
    double t = 0;
    for (size_t u = 0; u < n; u++)
        t += tf[u] + tb[u];
    return t;
}

static int site_index(const bal_problem *pb, const char *s)
{
    for (int i = 0; i < pb->n_sites; i++)
        if (!strcmp(pb->site[i], s))
            return i;
    return -1;
}

void bal_problem_free(bal_problem *pb)
{
    if (!pb)
        return;
    free(pb->unit);
    free(pb->dev);
    free(pb->tf);
    free(pb->tb);
    free(pb->pre);
    free(pb->popt);
    free(pb->topt);
    free(pb->rate);
    free(pb->pstatic);
    free(pb->pstash);
    free(pb->pparam);
    free(pb->measured);
    free(pb->site_of);
    free(pb->host_of);
    free(pb->site);
    free(pb->inside);
    free(pb->between);
    free(pb);
}

/* Device d's cpu pool: both sizes positive, and the pool's size the same as
 * every earlier device of that pool says. */
static int pool_check(const bal_device *dev, size_t d, sl_err *err)
{
    const bal_device *x = &dev[d];
    if (!x->cpu_pool[0])
        return 0;
    if (!(x->pool_cpus > 0) || !(x->cpus > 0) || !isfinite(x->pool_cpus) || !isfinite(x->cpus) ||
        x->pool_cpus > 1e6 || x->cpus > 1e6)
        return sl_err_set(err, SL_EINVAL,
                          "device %s: cpu pool '%s' needs pool_cpus and cpus between 0 and 1e6, "
                          "got %g and %g", x->id, x->cpu_pool, x->pool_cpus, x->cpus);
    for (size_t e = 0; e < d; e++)
        if (!strcmp(dev[e].cpu_pool, x->cpu_pool) && dev[e].pool_cpus != x->pool_cpus)
            return sl_err_set(err, SL_EINVAL,
                              "device %s: cpu pool '%s' has %g cpus, but device %s says %g", x->id,
                              x->cpu_pool, x->pool_cpus, dev[e].id, dev[e].pool_cpus);
    return 0;
}

bal_problem *bal_problem_new(const bal_unit *units, int n_units, const bal_device *dev, int n_dev,
                             const bal_network *net, sl_err *err)
{
    if (n_units < 1 || n_units > 1000000 || n_dev < 1 || n_dev > 100000) {
        sl_err_set(err, SL_EINVAL, "need 1..1000000 units and 1..100000 devices, got %d and %d",
                   n_units, n_dev);
        return NULL;
    }
    if ((double)n_units * n_dev > 5e7) {
        sl_err_set(err, SL_EINVAL, "%d units x %d devices is too large", n_units, n_dev);
        return NULL;
    }
    if (!link_ok(net->same_host) || !link_ok(net->inside_site) || !link_ok(net->between_sites)) {
        sl_err_set(err, SL_EINVAL, "network: bandwidth must be positive, latency non-negative");
        return NULL;
    }
    for (int u = 0; u < n_units; u++) {
        const bal_unit *x = &units[u];
        if (!(x->fwd_flops >= 0) || !(x->bwd_flops >= 0) || !isfinite(x->fwd_flops) ||
            !isfinite(x->bwd_flops) || x->param_bytes > (1ull << 50) ||
            x->optim_bytes > (1ull << 52) || x->stash_bytes > (1ull << 50)) {
            sl_err_set(err, SL_EINVAL, "unit %d: FLOPs or bytes out of range", u);
            return NULL;
        }
    }
    bal_problem *pb = sl_xcalloc(1, sizeof *pb);
    size_t nu = (size_t)n_units, nd = (size_t)n_dev;
    pb->n_units = n_units;
    pb->n_dev = n_dev;
    pb->unit = sl_xmalloc(nu * sizeof *pb->unit);
    memcpy(pb->unit, units, nu * sizeof *units);
    pb->dev = sl_xmalloc(nd * sizeof *pb->dev);
    memcpy(pb->dev, dev, nd * sizeof *dev);
    pb->tf = sl_xmalloc(nd * nu * sizeof(double));
    pb->tb = sl_xmalloc(nd * nu * sizeof(double));
    pb->pre = sl_xmalloc(nd * (nu + 1) * sizeof(double));
    pb->popt = sl_xmalloc(nd * (nu + 1) * sizeof(double));
    pb->topt = sl_xmalloc(nd * nu * sizeof(double));
    pb->rate = sl_xmalloc(nd * sizeof(double));
    pb->pstatic = sl_xmalloc((nu + 1) * sizeof(uint64_t));
    pb->pstash = sl_xmalloc((nu + 1) * sizeof(uint64_t));
    pb->pparam = sl_xmalloc((nu + 1) * sizeof(uint64_t));
    pb->measured = sl_xcalloc(nd, 1);
    pb->pstatic[0] = pb->pstash[0] = pb->pparam[0] = 0;
    for (size_t u = 0; u < nu; u++) {
        pb->pstatic[u + 1] = pb->pstatic[u] + units[u].param_bytes + units[u].optim_bytes;
        pb->pstash[u + 1] = pb->pstash[u] + units[u].stash_bytes;
        pb->pparam[u + 1] = pb->pparam[u] + units[u].param_bytes;
    }
    double total_fwd = 0;
    for (size_t u = 0; u < nu; u++)
        total_fwd += units[u].fwd_flops;
    for (size_t d = 0; d < nd; d++) {
        bal_device *x = &pb->dev[d];
        x->id[BAL_NAME_MAX - 1] = x->site[BAL_NAME_MAX - 1] = x->host[BAL_NAME_MAX - 1] = 0;
        x->cpu_pool[BAL_NAME_MAX - 1] = x->net_ns[BAL_NAME_MAX - 1] = 0;
        x->backend[sizeof x->backend - 1] = 0;
        if (pool_check(pb->dev, d, err)) {
            bal_problem_free(pb);
            return NULL;
        }
        double *tf = pb->tf + d * nu, *tb = pb->tb + d * nu, fsum = 0;
        if (x->unit_fwd_s && x->unit_bwd_s) {
            pb->measured[d] = 1;
            for (size_t u = 0; u < nu; u++) {
                tf[u] = x->unit_fwd_s[u];
                tb[u] = x->unit_bwd_s[u];
                if (!(tf[u] >= 0) || !(tb[u] >= 0) || !isfinite(tf[u]) || !isfinite(tb[u])) {
                    sl_err_set(err, SL_EINVAL, "device %s: unit %zu time must be >= 0", x->id, u);
                    bal_problem_free(pb);
                    return NULL;
                }
                fsum += tf[u];
            }
            if (!(pre_total(tf, tb, nu) > 0)) {
                sl_err_set(err, SL_EINVAL, "device %s: measured unit times are all zero", x->id);
                bal_problem_free(pb);
                return NULL;
            }
            pb->rate[d] = fsum > 0 && total_fwd > 0 ? total_fwd / fsum : 1e12;
        } else {
            if (!(x->flops > 0) || !isfinite(x->flops)) {
                sl_err_set(err, SL_EINVAL, "device %s: needs flops > 0 or measured unit times",
                           x->id);
                bal_problem_free(pb);
                return NULL;
            }
            for (size_t u = 0; u < nu; u++) {
                tf[u] = units[u].fwd_flops / x->flops;
                tb[u] = units[u].bwd_flops / x->flops;
            }
            pb->rate[d] = x->flops;
        }
        x->unit_fwd_s = tf; /* now points into pb */
        x->unit_bwd_s = tb;
        double *pre = pb->pre + d * (nu + 1);
        pre[0] = 0;
        for (size_t u = 0; u < nu; u++)
            pre[u + 1] = pre[u] + tf[u] + tb[u];
        double *popt = pb->popt + d * (nu + 1), *to = pb->topt + d * nu;
        popt[0] = 0;
        for (size_t u = 0; u < nu; u++) {
            to[u] = x->unit_optim_s ? x->unit_optim_s[u]
                                    : BAL_OPT_FLOPS_PER_PARAM * (double)units[u].param_bytes / 4 /
                                          pb->rate[d];
            if (!(to[u] >= 0) || !isfinite(to[u])) {
                sl_err_set(err, SL_EINVAL, "device %s: unit %zu optimizer time must be >= 0",
                           x->id, u);
                bal_problem_free(pb);
                return NULL;
            }
            popt[u + 1] = popt[u] + to[u];
        }
        if (x->unit_optim_s)
            x->unit_optim_s = to; /* now points into pb */
    }
    /* sites in order of first appearance; hosts as indices (-1: own host) */
    pb->site = sl_xcalloc(nd, sizeof *pb->site);
    pb->site_of = sl_xmalloc(nd * sizeof(int));
    pb->host_of = sl_xmalloc(nd * sizeof(int));
    for (size_t d = 0; d < nd; d++) {
        int s = site_index(pb, pb->dev[d].site);
        if (s < 0) {
            s = pb->n_sites++;
            memcpy(pb->site[s], pb->dev[d].site, BAL_NAME_MAX);
        }
        pb->site_of[d] = s;
        pb->host_of[d] = -1;
        if (pb->dev[d].host[0])
            for (size_t e = 0; e <= d; e++)
                if (!strcmp(pb->dev[e].host, pb->dev[d].host) && pb->site_of[e] == s) {
                    pb->host_of[d] = (int)e;
                    break;
                }
    }
    size_t ns = (size_t)pb->n_sites;
    pb->wire_act = pb->wire_grad = 1;
    pb->same_host = net->same_host;
    pb->inside = sl_xmalloc(ns * sizeof(bal_link));
    pb->between = sl_xmalloc(ns * ns * sizeof(bal_link));
    for (size_t s = 0; s < ns; s++)
        pb->inside[s] = net->inside_site;
    for (size_t s = 0; s < ns * ns; s++)
        pb->between[s] = net->between_sites;
    for (int i = 0; i < net->n_inside; i++) {
        int s = site_index(pb, net->inside[i].site);
        if (s < 0 || !link_ok(net->inside[i].link)) {
            sl_err_set(err, SL_EINVAL, "network: site '%s' %s", net->inside[i].site,
                       s < 0 ? "has no devices" : "has a bad link");
            bal_problem_free(pb);
            return NULL;
        }
        pb->inside[s] = net->inside[i].link;
    }
    unsigned char *given = sl_xcalloc(ns * ns, 1);
    for (int i = 0; i < net->n_links; i++) {
        int a = site_index(pb, net->links[i].a), b = site_index(pb, net->links[i].b);
        if (a >= 0 && b >= 0 && given[(size_t)a * ns + b]) {
            sl_err_set(err, SL_EINVAL, "network: link %s-%s is given twice", net->links[i].a,
                       net->links[i].b);
            free(given);
            bal_problem_free(pb);
            return NULL;
        }
        if (a >= 0 && b >= 0)
            given[(size_t)a * ns + b] = given[(size_t)b * ns + a] = 1;
        if (a < 0 || b < 0 || a == b || !link_ok(net->links[i].link)) {
            sl_err_set(err, SL_EINVAL, "network: link %s-%s: %s", net->links[i].a,
                       net->links[i].b,
                       a < 0 || b < 0 ? "unknown site" : a == b ? "a site to itself"
                                                            : "bad bandwidth or latency");
            free(given);
            bal_problem_free(pb);
            return NULL;
        }
        pb->between[(size_t)a * ns + b] = pb->between[(size_t)b * ns + a] = net->links[i].link;
    }
    free(given);
    return pb;
}

bal_problem *bal_problem_subset(const bal_problem *pb, const unsigned char *keep, sl_err *err)
{
    int D = pb->n_dev, ns = pb->n_sites, k = 0;
    bal_device *dev = sl_xmalloc((size_t)D * sizeof *dev);
    for (int d = 0; d < D; d++)
        if (keep[d]) {
            dev[k] = pb->dev[d];
            if (!pb->measured[d])
                dev[k].unit_fwd_s = dev[k].unit_bwd_s = NULL;
            k++;
        }
    /* every link of the sites kept, given explicitly */
    unsigned char *has = sl_xcalloc((size_t)ns, 1);
    for (int d = 0; d < D; d++)
        if (keep[d])
            has[pb->site_of[d]] = 1;
    bal_site_inside *in = sl_xcalloc((size_t)ns, sizeof *in);
    bal_site_link *ln = sl_xcalloc((size_t)ns * ns + 1, sizeof *ln);
    bal_network net = bal_network_default();
    net.same_host = pb->same_host;
    for (int a = 0; a < ns; a++) {
        if (!has[a])
            continue;
        memcpy(in[net.n_inside].site, pb->site[a], BAL_NAME_MAX);
        in[net.n_inside++].link = pb->inside[a];
        for (int b = a + 1; b < ns; b++)
            if (has[b]) {
                bal_site_link *x = &ln[net.n_links++];
                memcpy(x->a, pb->site[a], BAL_NAME_MAX);
                memcpy(x->b, pb->site[b], BAL_NAME_MAX);
                x->link = pb->between[(size_t)a * ns + b];
            }
    }
    net.inside = in;
    net.links = ln;
    bal_problem *sub = k ? bal_problem_new(pb->unit, pb->n_units, dev, k, &net, err) : NULL;
    if (!k)
        sl_err_set(err, SL_EINVAL, "subset: no device kept");
    if (sub) {
        sub->wire_act = pb->wire_act;
        sub->wire_grad = pb->wire_grad;
    }
    free(dev);
    free(has);
    free(in);
    free(ln);
    return sub;
}

bal_problem *bal_problem_merge_prefix(const bal_problem *pb, int k, sl_err *err)
{
    int n = pb->n_units, D = pb->n_dev;
    if (k < 0 || k >= n - 1) {
        sl_err_set(err, SL_EINVAL, "cannot keep units 0..%d together in a model of %d units", k, n);
        return NULL;
    }
    int m = n - k;
    bal_unit *units = sl_xmalloc((size_t)m * sizeof *units);
    units[0] = pb->unit[0];
    for (int u = 1; u <= k; u++) {
        const bal_unit *x = &pb->unit[u];
        units[0].fwd_flops += x->fwd_flops;
        units[0].bwd_flops += x->bwd_flops;
        units[0].param_bytes += x->param_bytes;
        units[0].optim_bytes += x->optim_bytes;
        units[0].stash_bytes += x->stash_bytes;
        units[0].out_bytes = x->out_bytes;
    }
    memcpy(units + 1, pb->unit + k + 1, (size_t)(m - 1) * sizeof *units);
    /* every device's times, as measured or estimated, summed the same way */
    bal_device *dev = sl_xmalloc((size_t)D * sizeof *dev);
    double *t = sl_xmalloc(3 * (size_t)D * m * sizeof *t);
    for (int d = 0; d < D; d++) {
        dev[d] = pb->dev[d];
        double *f = t + (size_t)d * m, *b = t + ((size_t)D + d) * m, *o = t + (2 * (size_t)D + d) * m;
        for (int u = 0; u < n; u++) {
            int v = u <= k ? 0 : u - k;
            const double *tf = pb->tf + (size_t)d * n, *tb = pb->tb + (size_t)d * n,
                         *to = pb->topt + (size_t)d * n;
            if (u <= k && u > 0) {
                f[0] += tf[u];
                b[0] += tb[u];
                o[0] += to[u];
            } else {
                f[v] = tf[u];
                b[v] = tb[u];
                o[v] = to[u];
            }
        }
        dev[d].unit_fwd_s = f;
        dev[d].unit_bwd_s = b;
        dev[d].unit_optim_s = o;
    }
    int ns = pb->n_sites;
    bal_site_inside *in = sl_xcalloc((size_t)ns + 1, sizeof *in);
    bal_site_link *ln = sl_xcalloc((size_t)ns * ns + 1, sizeof *ln);
    bal_network net = bal_network_default();
    net.same_host = pb->same_host;
    for (int a = 0; a < ns; a++) {
        memcpy(in[net.n_inside].site, pb->site[a], BAL_NAME_MAX);
        in[net.n_inside++].link = pb->inside[a];
        for (int c = a + 1; c < ns; c++) {
            bal_site_link *x = &ln[net.n_links++];
            memcpy(x->a, pb->site[a], BAL_NAME_MAX);
            memcpy(x->b, pb->site[c], BAL_NAME_MAX);
            x->link = pb->between[(size_t)a * ns + c];
        }
    }
    net.inside = in;
    net.links = ln;
    bal_problem *out = bal_problem_new(units, m, dev, D, &net, err);
    if (out) {
        out->wire_act = pb->wire_act;
        out->wire_grad = pb->wire_grad;
    }
    free(units);
    free(dev);
    free(t);
    free(in);
    free(ln);
    return out;
}

int bal_plan_expand_prefix(bal_plan *pl, const bal_problem *pb, int k, sl_err *err)
{
    int n = pb->n_units;
    if (k < 0 || pl->n_units != n - k)
        return sl_err_set(err, SL_EINVAL, "a plan of %d units does not expand by %d to %d", pl->n_units,
                          k, n);
    double *f = sl_xcalloc((size_t)n, sizeof *f), *b = sl_xcalloc((size_t)n, sizeof *b),
           *o = sl_xcalloc((size_t)n, sizeof *o);
    for (int i = 0; i < pl->n_stages; i++) {
        bal_stage *s = &pl->stage[i];
        s->first = s->first == 0 ? 0 : s->first + k;
        s->last += k;
        for (int u = s->first; u <= s->last; u++) {
            f[u] = pb->tf[(size_t)s->device * n + u];
            b[u] = pb->tb[(size_t)s->device * n + u];
            o[u] = pb->topt[(size_t)s->device * n + u];
        }
    }
    free(pl->unit_fwd_s);
    free(pl->unit_bwd_s);
    free(pl->unit_optim_s);
    pl->unit_fwd_s = f;
    pl->unit_bwd_s = b;
    pl->unit_optim_s = o;
    pl->n_units = n;
    return 0;
}

int bal_problem_set_wire(bal_problem *pb, double act, double grad, sl_err *err)
{
    if (!(act > 0 && act <= 16) || !(grad > 0 && grad <= 16))
        return sl_err_set(err, SL_EINVAL, "wire ratios must be in (0, 16], got %g and %g", act,
                          grad);
    pb->wire_act = act;
    pb->wire_grad = grad;
    return 0;
}

int bal_problem_n_units(const bal_problem *pb) { return pb->n_units; }
int bal_problem_n_devices(const bal_problem *pb) { return pb->n_dev; }
const bal_unit *bal_problem_unit(const bal_problem *pb, int u) { return &pb->unit[u]; }
const bal_device *bal_problem_device(const bal_problem *pb, int d) { return &pb->dev[d]; }

double bal_unit_fwd_s(const bal_problem *pb, int d, int u)
{
    return pb->tf[(size_t)d * pb->n_units + u];
}

double bal_unit_bwd_s(const bal_problem *pb, int d, int u)
{
    return pb->tb[(size_t)d * pb->n_units + u];
}

double bal_optim_s(const bal_problem *pb, int d, int first, int last)
{
    const double *p = pb->popt + (size_t)d * (pb->n_units + 1);
    return p[last + 1] - p[first];
}

bal_link bal_problem_link(const bal_problem *pb, int a, int b)
{
    if (a == b) /* a device to itself: as on one host */
        return pb->same_host;
    if (pb->host_of[a] >= 0 && pb->host_of[a] == pb->host_of[b])
        return pb->same_host;
    int sa = pb->site_of[a], sb = pb->site_of[b];
    if (sa == sb)
        return pb->inside[sa];
    return pb->between[(size_t)sa * pb->n_sites + sb];
}
