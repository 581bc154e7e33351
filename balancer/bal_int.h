/* bal_int.h - the balancer's internals shared between its .c files. */
#ifndef BAL_INT_H
#define BAL_INT_H

#include <stdint.h>

#include "bal.h"

/* Optimizer step cost of a device without measured optimizer times: AdamW
 * touches every parameter a few times and is memory-bound; we charge this
 * many FLOPs per parameter at the device's rate. */
#define BAL_OPT_FLOPS_PER_PARAM 16.0

/* Limits of the seven BERT sizes in config.json order (hidden_size,
 * num_hidden_layers, num_attention_heads, intermediate_size, vocab_size,
 * max_position_embeddings, type_vocab_size). */
extern const int bal_bert_min[7], bal_bert_max[7];

struct bal_problem {
    int n_units, n_dev;
    bal_unit *unit;
    bal_device *dev;
    double *tf, *tb;      /* [d * n_units + u] seconds */
    double *pre;          /* [d * (n_units + 1) + k] prefix of tf + tb */
    double *topt;         /* [d * n_units + u] optimizer-step seconds, measured or estimated */
    double *popt;         /* [d * (n_units + 1) + k] prefix of topt */
    double *rate;         /* effective FLOP/s per device (optimizer estimate) */
    uint64_t *pstatic;    /* prefix of param + optim bytes, n_units + 1 */
    uint64_t *pstash;     /* prefix of stash bytes */
    uint64_t *pparam;     /* prefix of param bytes */
    unsigned char *measured; /* the device came with unit_seconds, not flops */
    int *site_of, *host_of;
    int n_sites;
    char (*site)[BAL_NAME_MAX];
    bal_link same_host;
    bal_link *inside;  /* n_sites */
    bal_link *between; /* n_sites * n_sites */
    /* bytes on the wire per byte of a boundary tensor (fp32): the codecs of
     * the activations (forward) and of their gradients (back) */
    double wire_act, wire_grad;
};

/* Internal helpers take cut points: s < e covers units s..e-1.
 * Stage time on device d between cuts s and e. */
static inline double bal_time(const bal_problem *pb, int d, int s, int e)
{
    const double *p = pb->pre + (size_t)d * (pb->n_units + 1);
    return p[e] - p[s];
}

/* Stashed micro-batches per stage: k[i], i < c->p. */
static inline void bal_inflight(const bal_chain *c, int *k)
{
    int x = 0;
    for (int i = c->p - 1; i >= 0; i--) {
        if (i < c->p - 1 && c->extra)
            x += c->extra[i];
        long v = c->schedule == BAL_GPIPE ? c->m : (long)c->p - i + x;
        k[i] = v < c->m ? (int)v : c->m;
    }
}

/* Bytes a stage needs: static (parameters, optimizer) + k stashed
 * micro-batches; UINT64_MAX when that does not fit in 64 bits. */
static inline uint64_t bal_mem_need(uint64_t st, uint64_t sh, int k)
{
    uint64_t need;
    if (__builtin_mul_overflow(sh, (uint64_t)k, &need) || __builtin_add_overflow(need, st, &need))
        return UINT64_MAX;
    return need;
}

static inline int bal_fits(const bal_problem *pb, int d, int s, int e, int k)
{
    uint64_t need = bal_mem_need(pb->pstatic[e] - pb->pstatic[s], pb->pstash[e] - pb->pstash[s], k);
    return need != UINT64_MAX && need <= pb->dev[d].mem_bytes;
}

/* Bytes of two stages on one device: cuts 0..a with k0 micro-batches stashed
 * and cuts b..n with kl (a U-shaped chain's data owner); UINT64_MAX on overflow. */
static inline uint64_t bal_owner_need(const bal_problem *pb, int a, int k0, int b, int kl)
{
    int n = pb->n_units;
    uint64_t x = bal_mem_need(pb->pstatic[a], pb->pstash[a], k0);
    uint64_t y = bal_mem_need(pb->pstatic[n] - pb->pstatic[b], pb->pstash[n] - pb->pstash[b], kl);
    uint64_t s;
    if (x == UINT64_MAX || y == UINT64_MAX || __builtin_add_overflow(x, y, &s))
        return UINT64_MAX;
    return s;
}

static inline int bal_owner_fits(const bal_problem *pb, int d, int a, int k0, int b, int kl)
{
    uint64_t need = bal_owner_need(pb, a, k0, b, kl);
    return need != UINT64_MAX && need <= pb->dev[d].mem_bytes;
}

/* A U-shaped chain: its first and last stage on one device (p >= 3). */
static inline int bal_is_u(const bal_chain *c) { return c->ushaped && c->p >= 3; }

/* Bytes on the wire of the boundary at cut e (after unit e-1): the
 * activation sent forward, its gradient sent back. */
static inline double bal_act_bytes(const bal_problem *pb, int e)
{
    return (double)pb->unit[e - 1].out_bytes * pb->wire_act;
}

static inline double bal_grad_bytes(const bal_problem *pb, int e)
{
    return (double)pb->unit[e - 1].out_bytes * pb->wire_grad;
}

/* A message of `fwd` bytes there (link f) and one of `back` bytes back
 * (link r): the round trip, latency and serialization both ways; *sf and
 * *sr get the serializations. */
static inline double bal_round_trip(bal_link f, bal_link r, double fwd, double back, double *sf,
                                    double *sr)
{
    *sf = fwd / f.bw;
    *sr = back / r.bw;
    return f.lat + r.lat + *sf + *sr;
}

/* The same for the boundary at cut e: the activation forward on f, the
 * gradient back on r. */
static inline double bal_cut_round_trip(const bal_problem *pb, bal_link f, bal_link r, int e,
                                        double *sf, double *sr)
{
    return bal_round_trip(f, r, bal_act_bytes(pb, e), bal_grad_bytes(pb, e), sf, sr);
}

/* bal_part.c: a plan from a chain without validating it (cuts must be valid). */
bal_plan *bal_plan_build(const bal_problem *pb, int algo, const bal_chain *c, const int *cuts);
/* First stage whose memory is exceeded, or -1. */
int bal_plan_overflow(const bal_problem *pb, const bal_chain *c, const int *cuts);
/* Closed-form estimate: fill (first micro-batch's round trip) + (m-1) cycles + optimizer. */
double bal_estimate(const bal_problem *pb, const bal_chain *c, const int *cuts, double cycle);
/* The micro-batch count for a chain (o->micro_batches if set); c->m is ignored. */
int bal_choose_m(const bal_problem *pb, const bal_chain *c, const int *cuts, const bal_opts *o);
/* even or sky at m micro-batches (0: chosen). */
bal_plan *bal_plan_baseline(const bal_problem *pb, int algo, const bal_opts *o, int m,
                            sl_err *err);

/* bal_chain_best to a relative tolerance (the search ranks with a coarse one). */
double bal_chain_best_tol(const bal_problem *pb, const bal_chain *c, int *cuts, double tol);
/* The same from a hint (a neighbouring chain's cycle, 0: none), adding the
 * DP cells it visited to *work (the search's budget). */
double bal_chain_best_work(const bal_problem *pb, const bal_chain *c, int *cuts, double tol,
                           double hint, long long *work);

/* The order of a stage's computes under both schedules: `warm` forwards
 * (1F1B: its warm-up, p - i - 1 when the plan gives none; GPipe: all m),
 * then one forward and one backward in turn, then the backwards left. With
 * nf forwards and nb backwards done, the next is a forward when this says
 * so, else a backward. */
static inline int bal_warm_forwards(int schedule, int stages, int i, int m, int warmup)
{
    int warm = schedule == BAL_GPIPE ? m : warmup < 0 ? stages - i - 1 : warmup;
    return warm > m ? m : warm;
}
static inline int bal_next_is_forward(int nf, int nb, int warm, int m)
{
    return nf < m && nf - warm <= nb;
}

/* bal_sim.c: stage i's computes in bal_stage_ops's order into out (2 m
 * entries): mb for a forward, -(mb + 1) for a backward; their count, -1 on
 * bad arguments. */
int bal_stage_computes(int schedule, int stages, int i, int micro_batches, int warmup, int *out);

/* bal_part.c: a falling profile's cuts (1F1B, not U-shaped): every stage's
 * (m - 1) b + (m - 1 - gamma w) f at most X (w its warm-up), memory fitting;
 * among them one with the smallest sum of stage times, which it returns
 * (INFINITY: none). */
double bal_chain_falling(const bal_problem *pb, const bal_chain *c, double gamma, double X,
                         int *cuts);

/* bal_exact.c: chains over every subset and order of up to BAL_EXACT_MAX
 * devices (the data owner not counted). out[0] is the optimum of the
 * bottleneck-cycle model (the fewest stages among the optimal chains); then,
 * for each bound cycle x (1 + ladder[i]), the chain with the fewest stages
 * that meets it when that is fewer than the previous. Returns the count. */
#define BAL_EXACT_MAX 12
#define BAL_EXACT_OUT 16
typedef struct bal_exact_chain {
    int p;
    int order[BAL_EXACT_MAX + 2], cuts[BAL_EXACT_MAX + 3];
    double cycle;
} bal_exact_chain;
int bal_exact_chains(const bal_problem *pb, int m, int schedule, int owner, const double *ladder,
                     int nl, bal_exact_chain *out);

/* bal_search.c */
bal_plan *bal_plan_optimal(const bal_problem *pb, const bal_opts *o, sl_err *err);

#endif
