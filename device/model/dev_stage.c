/* dev_stage.c - forward and backward of a stage's units, llm.c style: one
 * block per layer, activations in one flat allocation per stash slot,
 * gradients of activations in scratch shared by all slots (backward runs one
 * micro-batch at a time). Every kn_* backward but the cross-entropy's
 * accumulates, so the scratch it writes into is zeroed first.
 *
 * Every op goes through the stage's backend (kn_be.h) and every buffer the
 * ops touch is the backend's: on the CPU that is host memory, on CUDA device
 * memory. Host data (tokens, labels, boundary activations, the losses) cross
 * over only with upload/download, which on the CPU are plain copies or are
 * skipped (`res` is 0: the stage then reads its buffers directly). */
#include "dev_stage.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kn_be.h"
#include "kn_body.h"
#include "sl_mem.h"
#include "sl_rng.h"
#include "sl_time.h"

/* Dropout sites (mixed with the unit index into the RNG stream). */
enum { SITE_EMBED = 1, SITE_ATTN = 2, SITE_ATTN_OUT = 3, SITE_FFN_OUT = 4, SITE_CLASSIFIER = 5 };

typedef struct embed_a {
    float *emb, *mean, *rstd, *out; /* out = dropout(LN(emb)), in place */
} embed_a;
typedef struct layer_a {
    /* gelu(h) is not kept: backward recomputes it (saves F floats per token) */
    float *qkv, *atto, *att, *res1, *mean1, *rstd1, *ln1, *h, *res2, *mean2, *rstd2, *out;
    /* bf16 compute: these replace qkv, atto, att and h (which are NULL) */
    uint16_t *qkv16, *atto16, *att16, *h16;
} layer_a;
typedef struct head_a {
    int M, cap;
    int32_t *idx, *tgt;   /* host: masked positions and their labels */
    int32_t *didx, *dtgt; /* the backend's copies (the host arrays when !res) */
    float *hloss;         /* host copy of losses (losses itself when !res) */
    float *xm, *d, *g, *l, *mean, *rstd, *probs, *losses;
    uint16_t *xm16, *l16; /* bf16 compute: these replace xm and l (NULL) */
} head_a;

/* The classification head's stash: one row per sequence (maxB rows). */
typedef struct cls_a {
    int32_t *idx, *tgt;   /* host: each sequence's [CLS] row and its class (-100: none) */
    int32_t *didx, *dtgt; /* the backend's copies (the host arrays when !res) */
    float *hloss;         /* host copy of losses (losses itself when !res) */
    float *xc, *pool, *drop, *probs, *losses; /* (B,C) x3, (B,K), (B) */
    uint16_t *xc16, *drop16; /* bf16 compute: these replace xc and drop (NULL) */
} cls_a;

typedef struct slot {
    float *base;
    float *in; /* copy of the input boundary activation (u0 > 0) */
    embed_a e;
    layer_a *l; /* indexed by unit - first layer unit of the stage */
    head_a h;
    cls_a k;    /* the classification head's (when the stage has it) */
    int B;      /* micro-batch size of the forward in this slot; 0 = empty */
    /* the micro-batch's int inputs as the ops read them: uploaded copies
     * (dtok, dseg, dvalid: maxB*T each) on a resident backend, else the
     * caller's arrays */
    const int32_t *tok, *seg, *valid;
    int32_t *dtok, *dseg, *dvalid;
} slot;

struct dev_stage {
    const kn_be *be;
    int res; /* be->resident: host views are copies (pull/push) */
    int recompute; /* slots keep layer outputs only; backward re-runs each layer's forward */
    int recompute_attn; /* backward recomputes the attention probabilities and output */
    int bf16;      /* optimizer moments stored as bf16 (mv holds 2*np uint16) */
    int bf16c;     /* bf16 compute: products on bf16 copies, some activations kept in bf16 */
    uint16_t *w16; /* bf16c: the parameters rounded to bf16 (np), the products' weights */
    int w16_stale; /* the parameters changed since w16 was made */
    uint16_t *A16, *D16; /* bf16c scratch: a product's input (N x max(F,C)) and the
                          * attention's output gradient (N x C), rounded to bf16 */
    uint16_t *L16, *X16; /* bf16c: l1 and a layer's input x rounded (N x C each), written
                          * by the LayerNorms that make them */
    const float *x16_of; /* the fp32 tensor X16 holds rounded (NULL: none) */
    uint64_t seed; /* run seed: keys the stochastic rounding of bf16 moments */
    uint16_t *hmv16; /* bf16 + res: host staging of the moments for pull/push */
    float *wbase;  /* `work`: one P_CHEAP block, or (recompute) one layer's full stash */
    sl_err fault; /* first failed buffer operation (zero/copy) since the last check */
    int faulted;
    dev_config c;
    int u0, u1, maxB, T, nslots, step;
    int has_embed, has_head, l0, nl; /* layer units l0 .. l0+nl-1 */
    int cls;  /* the head is the classification head (task classify) */
    int tied; /* the head is the MLM head, whose decoder is the word embeddings */
    dev_tensor *t;
    int nt;
    size_t np;
    float *params, *grads, *mv;
    float *hparams, *hgrads, *hmv; /* host views: the same pointers when !res */
    float *htied, *dtied;          /* res: host view of the tied gradient, upload scratch */
    layer_a work;  /* views into wbase */
    /* LOCAL role (unit 0 and the head): the embeddings' part of the word-
     * embedding gradient is kept apart from the head's (which accumulates in
     * the gradient itself) and added in dev_stage_grad_finish, so the sum is
     * the split's embed + head bit for bit. It lives only at the rows of the
     * tokens seen this step: etail row j is token erows[j]. */
    float *etail, *etmp;    /* backend, ecap x C each */
    int32_t *erow_of;       /* host, V: compact row of a token id, -1 if none */
    int32_t *erows, *derows; /* host / backend (the same when !res), ecap */
    int32_t *hetok, *detok; /* a micro-batch's tokens as compact rows, host / backend */
    int ecap, en;
    /* per-unit parameter and gradient pointers, in layout order */
    float **pp, **gp; /* pp[k] for tensor k */
    int *first;       /* first[u - u0] = index of the unit's first tensor */
    float *head_wte, *head_gwte;
    slot *slots;
    /* scratch. Q (the attention's input gradient, 3C per token) is F1: the
     * layer's backward is done with F1 before it needs Q. X: the layers'
     * outputs in forward (each layer overwrites its input there) and, in
     * backward, a layer's input recomputed from the previous layer's stash. */
    float *G0, *G1, *T1, *T2, *F1, *F2, *Q, *X;
    int hcap;
    float *dl, *dg, *dd, *dxm; /* the head's (M,C) gradients */
    size_t bytes;
    int oom;                   /* an allocation failed (sizes come from the config) */
    int prof;                  /* time the matrix multiplies (benchmarks) */
    double mm_s, mm_flops;
    float *logits_out;         /* dev_stage_forward_logits: host copy of the head's logits */
    size_t logits_cap;
};

/* The matrix multiplies, optionally timed: they are most of the work, and the
 * benchmark reports their share and their speed against plain sgemm. */
static void mm_fwd(dev_stage *s, float *out, const float *inp, const float *w, const float *b,
                   int N, int IC, int OC)
{
    double t0 = s->prof ? sl_now_s() : 0;
    s->be->matmul_forward(out, inp, w, b, N, IC, OC);
    if (s->prof) {
        s->mm_s += sl_now_s() - t0;
        s->mm_flops += 2.0 * N * IC * OC;
    }
}

static void mm_bwd(dev_stage *s, float *dinp, float *dw, float *db, const float *dout,
                   const float *inp, const float *w, int N, int IC, int OC)
{
    double t0 = s->prof ? sl_now_s() : 0;
    s->be->matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
    if (s->prof) {
        s->mm_s += sl_now_s() - t0;
        s->mm_flops += 4.0 * N * IC * OC;
    }
}

/* The same in bf16 (bf16 compute): inputs and weights bf16, the output fp32
 * (out) or bf16 (out16); backward rounds dout for its products. */
static void mm_fwd16(dev_stage *s, float *out, uint16_t *out16, const uint16_t *inp16,
                     const uint16_t *w16, const float *b, int N, int IC, int OC)
{
    double t0 = s->prof ? sl_now_s() : 0;
    s->be->matmul_forward_bf16(out, out16, inp16, w16, b, N, IC, OC);
    if (s->prof) {
        s->mm_s += sl_now_s() - t0;
        s->mm_flops += 2.0 * N * IC * OC;
    }
}

static void mm_bwd16(dev_stage *s, float *dinp, float *dw, float *db, const float *dout,
                     const uint16_t *inp16, const uint16_t *w16, int N, int IC, int OC)
{
    double t0 = s->prof ? sl_now_s() : 0;
    s->be->matmul_backward_bf16(dinp, dw, db, dout, inp16, w16, N, IC, OC);
    if (s->prof) {
        s->mm_s += sl_now_s() - t0;
        s->mm_flops += 4.0 * N * IC * OC;
    }
}

/* x rounded to bf16 (N x C): X16, which the LayerNorm that made x wrote
 * (x16_of), or converted now. Only those LayerNorms set x16_of: they are
 * the only writers of the tensors they tag, while a converted input (the
 * embeddings' output, a stage's input) is written again by the next
 * micro-batch without X16. */
static const uint16_t *x16_for(dev_stage *s, const float *x, size_t NC)
{
    if (s->x16_of != x) {
        s->be->to_bf16(s->X16, x, NC);
        s->x16_of = NULL;
    }
    return s->X16;
}

/* The bf16 copy of a parameter tensor (its offset in w16 is its offset in
 * the parameters). */
static const uint16_t *w16_of(const dev_stage *s, const float *p)
{
    return s->w16 + (p - s->params);
}

void dev_stage_prof(dev_stage *s, int on)
{
    s->prof = on;
    s->mm_s = s->mm_flops = 0;
}

void dev_stage_prof_get(const dev_stage *s, double *mm_seconds, double *mm_flops)
{
    *mm_seconds = s->mm_s;
    *mm_flops = s->mm_flops;
}

int dev_precision_flags(const char *name)
{
    if (name && !strcmp(name, "fp32"))
        return 0;
    if (name && !strcmp(name, "bf16"))
        return DEV_STAGE_BF16_COMPUTE;
    return -1;
}

const char *dev_precision_name(unsigned flags)
{
    return flags & DEV_STAGE_BF16_COMPUTE ? "bf16" : "fp32";
}

void dev_optim_default(dev_optim *o)
{
    memset(o, 0, sizeof *o);
    o->kind = DEV_OPT_ADAMW;
    o->lr = 1e-4f;
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->eps = 1e-6f;
    o->wd = 0.01f;
    o->clip = 1.0f;
    o->warmup = 0;
    o->total = 0;
}

float dev_optim_lr(const dev_optim *o, int t)
{
    if (o->warmup > 0 && t <= o->warmup)
        return o->lr * (float)t / (float)o->warmup;
    if (o->total > o->warmup && t > o->warmup) {
        if (t >= o->total)
            return 0.0f;
        return o->lr * (float)(o->total - t) / (float)(o->total - o->warmup);
    }
    return o->lr;
}

float dev_clip_scale(double norm, float max_norm)
{
    if (max_norm <= 0 || !(norm >= 0))
        return 1.0f;
    double s = (double)max_norm / (norm + 1e-6);
    return s < 1.0 ? (float)s : 1.0f;
}

/* Hands out 64-byte aligned pieces of a slot's block; with base NULL it only
 * counts. */
/* Sizes follow from the config (user input): allocation failure is an error,
 * not an exit. */
static float *falloc(dev_stage *s, size_t n)
{
    float *p = s->be->alloc(n * sizeof(float), NULL);
    if (!p)
        s->oom = 1;
    return p;
}

static void bfree(const dev_stage *s, void *p)
{
    if (p)
        s->be->free(p);
}

/* Host memory for the host views of a resident stage. */
static float *halloc(dev_stage *s, size_t n)
{
    float *p = sl_try_aligned_alloc((n ? n : 1) * sizeof(float));
    if (!p)
        s->oom = 1;
    return p;
}

/* Buffer operations whose failure is reported by the next check_fault. */
static void zero(dev_stage *s, void *p, size_t floats)
{
    if (s->be->zero(p, floats * sizeof(float), s->faulted ? NULL : &s->fault))
        s->faulted = 1;
}
static void dcopy(dev_stage *s, void *dst, const void *src, size_t floats)
{
    if (s->be->copy(dst, src, floats * sizeof(float), s->faulted ? NULL : &s->fault))
        s->faulted = 1;
}

/* An error return after ops were issued: waits for them and drops any
 * failure they latched, so it is not reported again by the next call. */
static int bail(dev_stage *s)
{
    s->be->sync(NULL);
    s->faulted = 0;
    return -1;
}

/* Waits for the backend and reports the first failure since the last call. */
static int check_fault(dev_stage *s, sl_err *err)
{
    int rc = s->be->sync(err);
    if (s->faulted) {
        if (err)
            *err = s->fault;
        s->faulted = 0;
        return -1;
    }
    return rc;
}

static float *carve(float *base, size_t *cur, size_t n)
{
    size_t o = *cur;
    *cur += (n + 15) & ~(size_t)15;
    return base ? base + o : NULL;
}
/* n bf16 values (two to a float slot) */
static uint16_t *carve16(float *base, size_t *cur, size_t n)
{
    return (uint16_t *)carve(base, cur, (n + 1) / 2);
}

/* Which parts of an encoder layer's activations a block holds:
 *   P_KEEP   what is worth keeping: qkv, the attention probabilities and
 *            output (unless recompute_attn), r1 and its statistics, h, r2
 *            and its statistics;
 *   P_CHEAP  what backward recomputes from P_KEEP before the layer's
 *            backward: l1 = LN1(r1), one elementwise pass (7% of a BERT
 *            layer's stash), and with recompute_attn the attention
 *            probabilities and output from qkv (22% more; it made config
 *            (b) 25% slower on the CPU, so it is an option). Slots keep
 *            P_KEEP and the stage holds one P_CHEAP block for all of them;
 *   P_OUT    the layer's output, the next layer's input. Slots do not keep
 *            it: it is LN2(r2), and backward recomputes it from the
 *            previous layer's P_KEEP into the stage's X just before the
 *            layer that reads it (its weight gradient needs it).
 * A recomputing stage's slots keep P_OUT only (its checkpoints), and its
 * work area all three. */
enum { P_KEEP = 1, P_CHEAP = 2, P_OUT = 4 };
static void layer_carve(const dev_stage *s, layer_a *a, float *base, size_t *cur, int parts)
{
    size_t N = (size_t)s->maxB * s->T, C = s->c.hidden, F = s->c.intermediate;
    size_t att = (size_t)s->maxB * s->c.heads * s->T * s->T;
    memset(a, 0, sizeof *a);
    int attn_cheap = s->recompute_attn && !s->recompute;
    if (parts & P_KEEP) {
        if (s->bf16c)
            a->qkv16 = carve16(base, cur, N * 3 * C);
        else
            a->qkv = carve(base, cur, N * 3 * C);
        if (!attn_cheap && s->bf16c) {
            a->atto16 = carve16(base, cur, N * C);
            a->att16 = carve16(base, cur, att);
        } else if (!attn_cheap) {
            a->atto = carve(base, cur, N * C);
            a->att = carve(base, cur, att);
        }
        a->res1 = carve(base, cur, N * C);
        a->mean1 = carve(base, cur, N);
        a->rstd1 = carve(base, cur, N);
        if (s->bf16c)
            a->h16 = carve16(base, cur, N * F);
        else
            a->h = carve(base, cur, N * F);
        a->res2 = carve(base, cur, N * C);
        a->mean2 = carve(base, cur, N);
        a->rstd2 = carve(base, cur, N);
    }
    if (parts & P_CHEAP) {
        a->ln1 = carve(base, cur, N * C);
        if (attn_cheap && s->bf16c) {
            a->atto16 = carve16(base, cur, N * C);
            a->att16 = carve16(base, cur, att);
        } else if (attn_cheap) {
            a->atto = carve(base, cur, N * C);
            a->att = carve(base, cur, att);
        }
    }
    if (parts & P_OUT)
        a->out = carve(base, cur, N * C);
}

static size_t slot_floats(const dev_stage *s, slot *sl, float *base)
{
    size_t N = (size_t)s->maxB * s->T, C = s->c.hidden;
    size_t cur = 0;
    if (s->u0 > 0)
        sl->in = carve(base, &cur, N * C);
    if (s->has_embed) {
        sl->e.emb = carve(base, &cur, N * C);
        sl->e.mean = carve(base, &cur, N);
        sl->e.rstd = carve(base, &cur, N);
        sl->e.out = carve(base, &cur, N * C);
    }
    for (int i = 0; i < s->nl; i++)
        layer_carve(s, &sl->l[i], base, &cur, s->recompute ? P_OUT : P_KEEP);
    return cur;
}

static int etail_reserve(dev_stage *s, int need, sl_err *err);
static int cls_alloc(dev_stage *s);
static void cls_free(const dev_stage *s, cls_a *k);

dev_stage *dev_stage_create(const dev_config *c, int u0, int u1, int max_B, int T, int slots,
                            uint64_t seed, const kn_be *be, unsigned flags, sl_err *err)
{
    if (dev_config_validate(c, err))
        return NULL;
    if (max_B < 1 || T < 1 || slots < 1 || slots > 1024) {
        sl_err_set(err, SL_EINVAL, "stage: bad micro-batch shape B=%d T=%d slots=%d", max_B, T,
                   slots);
        return NULL;
    }
    if (T > c->max_pos) {
        sl_err_set(err, SL_EINVAL, "sequence length %d exceeds max_position_embeddings %d", T,
                   c->max_pos);
        return NULL;
    }
    dev_stage *s = sl_xcalloc(1, sizeof *s);
    s->be = be ? be : kn_be_cpu();
    s->res = s->be->resident;
    s->recompute = (flags & DEV_STAGE_RECOMPUTE) != 0;
    s->recompute_attn = (flags & DEV_STAGE_RECOMPUTE_ATTN) && !s->recompute;
    s->bf16 = (flags & DEV_STAGE_BF16_STATE) != 0;
    s->bf16c = (flags & DEV_STAGE_BF16_COMPUTE) != 0;
    if (s->bf16c && !s->be->bf16_check) {
        sl_err_set(err, SL_ENOTSUP, "bf16 compute: the %s backend has none", s->be->name);
        free(s);
        return NULL;
    }
    if (s->bf16c && s->be->bf16_check(err)) {
        sl_err_wrap(err, "bf16 compute on %s", s->be->name);
        free(s);
        return NULL;
    }
    s->seed = seed;
    s->c = *c;
    s->u0 = u0;
    s->u1 = u1;
    s->maxB = max_B;
    s->T = T;
    s->nslots = slots;
    if (dev_model_layout(c, u0, u1, &s->t, &s->nt, &s->np, err)) {
        free(s);
        return NULL;
    }
    int head = dev_unit_head(c);
    s->has_embed = u0 == 0;
    s->has_head = u1 == head;
    s->cls = s->has_head && c->task == DEV_TASK_CLASSIFY;
    s->tied = s->has_head && !s->cls;
    s->l0 = u0 > 0 ? u0 : 1;
    int lend = u1 < head ? u1 : c->layers;
    s->nl = lend >= s->l0 ? lend - s->l0 + 1 : 0;

    size_t V = c->vocab, C = c->hidden;
    size_t gtotal = s->np;
    s->params = falloc(s, s->np);
    s->grads = falloc(s, gtotal);
    s->mv = falloc(s, s->bf16 ? s->np : 2 * s->np); /* bf16: 2*np uint16 */
    if (s->bf16c)
        s->w16 = (uint16_t *)falloc(s, (s->np + 1) / 2);
    s->w16_stale = 1;
    if (s->res) {
        s->hparams = halloc(s, s->np);
        s->hgrads = halloc(s, s->np);
    } else {
        s->hparams = s->params;
        s->hgrads = s->grads;
    }
    /* the moments' host view: the moments themselves for fp32 on the host,
     * else a copy made by the first dev_stage_pull (dev_stage_drop_views) */
    if (!s->bf16 && !s->res)
        s->hmv = s->mv;
    s->bytes = (s->np * (s->bf16 ? 2 : 3) + gtotal) * sizeof(float) +
               (s->bf16c ? s->np * sizeof(uint16_t) : 0);
    if (s->oom) {
        sl_err_set(err, SL_ENOMEM, "cannot allocate %.1f MiB of parameters, gradients and optimizer state for units %d..%d",
                   (double)s->bytes / 1048576.0, u0, u1);
        dev_stage_free(s);
        return NULL;
    }
    s->pp = sl_xcalloc((size_t)s->nt, sizeof *s->pp);
    s->gp = sl_xcalloc((size_t)s->nt, sizeof *s->gp);
    s->first = sl_xcalloc((size_t)(u1 - u0 + 1), sizeof *s->first);
    for (int k = s->nt - 1; k >= 0; k--) {
        s->pp[k] = s->params + s->t[k].offset;
        s->gp[k] = s->grads + s->t[k].offset;
        s->first[s->t[k].unit - u0] = k;
    }
    if (s->tied) {
        int k = s->first[head - u0];
        if (s->has_embed) {
            s->head_wte = s->pp[0];
            s->head_gwte = s->gp[0];
        } else {
            s->head_wte = s->pp[k + 5];
            s->head_gwte = s->gp[k + 5];
        }
    }

    s->slots = sl_xcalloc((size_t)slots, sizeof *s->slots);
    for (int i = 0; i < slots; i++) {
        slot *sl = &s->slots[i];
        sl->l = sl_xcalloc((size_t)(s->nl ? s->nl : 1), sizeof *sl->l);
        slot tmp = *sl;
        size_t n = slot_floats(s, &tmp, NULL);
        sl->base = falloc(s, n ? n : 1);
        if (sl->base)
            slot_floats(s, sl, sl->base);
        s->bytes += n * sizeof(float);
        if (s->res) {
            size_t NT = (size_t)max_B * T;
            sl->dtok = (int32_t *)falloc(s, NT);
            sl->dseg = (int32_t *)falloc(s, NT);
            sl->dvalid = (int32_t *)falloc(s, NT);
            s->bytes += 3 * NT * sizeof(int32_t);
        }
    }
    size_t N = (size_t)max_B * T, F = c->intermediate;
    s->G0 = falloc(s, N * C);
    s->G1 = falloc(s, N * C);
    s->T1 = falloc(s, N * C);
    s->T2 = falloc(s, N * C);
    size_t F1 = F > 3 * C ? F : 3 * C;
    s->F1 = falloc(s, N * F1);
    s->F2 = falloc(s, N * F);
    s->Q = s->F1;
    int chain = !s->recompute && s->nl > 0;
    s->X = chain ? falloc(s, N * C) : NULL;
    s->bytes += (N * C * (chain ? 5 : 4) + N * F1 + N * F) * sizeof(float);
    if (s->bf16c) { /* a product's input, the attention's output gradient, l1, x: rounded */
        size_t fa = F > C ? F : C;
        s->A16 = (uint16_t *)falloc(s, (N * fa + 1) / 2);
        s->D16 = (uint16_t *)falloc(s, (N * C + 1) / 2);
        s->L16 = (uint16_t *)falloc(s, (N * C + 1) / 2);
        s->X16 = (uint16_t *)falloc(s, (N * C + 1) / 2);
        s->bytes += N * (fa + 3 * C) * sizeof(uint16_t);
    }
    if (s->nl > 0) { /* the shared part of every layer's stash (see layer_carve) */
        int parts = s->recompute ? P_KEEP | P_CHEAP | P_OUT : P_CHEAP;
        size_t n = 0;
        layer_carve(s, &s->work, NULL, &n, parts);
        s->wbase = falloc(s, n);
        n = 0;
        if (s->wbase)
            layer_carve(s, &s->work, s->wbase, &n, parts);
        s->bytes += n * sizeof(float);
        for (int i = 0; !s->recompute && i < slots; i++)
            for (int l = 0; l < s->nl; l++) {
                layer_a *a = &s->slots[i].l[l];
                a->ln1 = s->work.ln1;
                if (s->recompute_attn) {
                    a->atto = s->work.atto;
                    a->att = s->work.att;
                    a->atto16 = s->work.atto16;
                    a->att16 = s->work.att16;
                }
            }
    }
    if (s->oom) {
        sl_err_set(err, SL_ENOMEM, "cannot allocate %.1f MiB for units %d..%d (B=%d, T=%d)",
                   (double)s->bytes / 1048576.0, u0, u1, max_B, T);
        dev_stage_free(s);
        return NULL;
    }
    if (s->cls && cls_alloc(s)) {
        sl_err_set(err, SL_ENOMEM, "cannot allocate the classification head's %d rows for units "
                   "%d..%d", max_B, u0, u1);
        dev_stage_free(s);
        return NULL;
    }
    if (s->has_embed && s->tied) {
        size_t NT = (size_t)max_B * T;
        s->erow_of = sl_xmalloc(V * sizeof(int32_t));
        for (size_t i = 0; i < V; i++)
            s->erow_of[i] = -1;
        s->hetok = sl_xmalloc(NT * sizeof(int32_t));
        s->detok = s->res ? (int32_t *)falloc(s, NT) : s->hetok;
        if (!s->detok || etail_reserve(s, NT < V ? (int)NT : (int)V, err)) {
            if (!s->detok)
                sl_err_set(err, SL_ENOMEM, "cannot allocate the token rows for units %d..%d", u0, u1);
            dev_stage_free(s);
            return NULL;
        }
    }
    memset(s->hparams, 0, s->np * sizeof(float));
    memset(s->hgrads, 0, s->np * sizeof(float));
    dev_model_init(s->t, s->nt, s->hparams, seed, c->init_range);
    zero(s, s->grads, gtotal);
    zero(s, s->mv, s->bf16 ? s->np : 2 * s->np);
    if ((s->res && s->be->upload(s->params, s->hparams, s->np * sizeof(float), err)) ||
        check_fault(s, err)) {
        sl_err_wrap(err, "units %d..%d on %s", u0, u1, s->be->name);
        dev_stage_free(s);
        return NULL;
    }
    return s;
}

/* The moments' host view (fp32, m then v) and, for bf16 on a resident
 * backend, the staging buffer; allocated on first use. */
static int views_alloc(dev_stage *s, sl_err *err)
{
    size_t n2 = 2 * s->np;
    if (!s->hmv && !(s->hmv = sl_try_aligned_alloc(n2 * sizeof(float))))
        return sl_err_set(err, SL_ENOMEM, "cannot allocate the optimizer state's host view");
    if (s->bf16 && s->res && !s->hmv16 &&
        !(s->hmv16 = sl_try_aligned_alloc(n2 * sizeof(uint16_t))))
        return sl_err_set(err, SL_ENOMEM, "cannot allocate the optimizer state's host view");
    return 0;
}

int dev_stage_pull(dev_stage *s, sl_err *err)
{
    size_t b = s->np * sizeof(float), n2 = 2 * s->np;
    if (s->res && (s->be->download(s->hparams, s->params, b, err) ||
                   s->be->download(s->hgrads, s->grads, b, err)))
        return sl_err_wrap(err, "copying the stage to the host");
    if (s->hmv == s->mv)
        return 0;
    if (views_alloc(s, err))
        return -1;
    if (!s->bf16)
        return s->be->download(s->hmv, s->mv, 2 * b, err) ? sl_err_wrap(err, "copying the stage to the host") : 0;
    const uint16_t *m16 = (const uint16_t *)s->mv;
    if (s->res) {
        if (s->be->download(s->hmv16, s->mv, n2 * sizeof(uint16_t), err))
            return sl_err_wrap(err, "copying the stage to the host");
        m16 = s->hmv16;
    }
    for (size_t i = 0; i < n2; i++)
        s->hmv[i] = sl_bf16_to_f32(m16[i]);
    return 0;
}

int dev_stage_push(dev_stage *s, sl_err *err)
{
    size_t b = s->np * sizeof(float), n2 = 2 * s->np;
    s->w16_stale = 1;
    if (s->res && s->be->upload(s->params, s->hparams, b, err))
        return sl_err_wrap(err, "copying the stage to %s", s->be->name);
    if (s->hmv == s->mv || !s->hmv) /* the moments are their own view, or were never viewed */
        return 0;
    if (!s->bf16)
        return s->be->upload(s->mv, s->hmv, 2 * b, err) ? sl_err_wrap(err, "copying the stage to %s", s->be->name) : 0;
    uint16_t *m16 = s->res ? s->hmv16 : (uint16_t *)s->mv;
    for (size_t i = 0; i < n2; i++) /* round to nearest: what was saved comes back unbiased */
        m16[i] = sl_f32_to_bf16(s->hmv[i]);
    if (s->res && s->be->upload(s->mv, s->hmv16, n2 * sizeof(uint16_t), err))
        return sl_err_wrap(err, "copying the stage to %s", s->be->name);
    return 0;
}

int dev_stage_pull_grads(dev_stage *s, sl_err *err)
{
    if (s->res && s->be->download(s->hgrads, s->grads, s->np * sizeof(float), err))
        return sl_err_wrap(err, "copying the gradients to the host");
    return 0;
}

int dev_stage_push_grads(dev_stage *s, sl_err *err)
{
    if (s->res && s->be->upload(s->grads, s->hgrads, s->np * sizeof(float), err))
        return sl_err_wrap(err, "copying the gradients to %s", s->be->name);
    return 0;
}

int dev_stage_pull_params(dev_stage *s, sl_err *err)
{
    if (s->res && s->be->download(s->hparams, s->params, s->np * sizeof(float), err))
        return sl_err_wrap(err, "copying the parameters to the host");
    return 0;
}

int dev_stage_push_params(dev_stage *s, sl_err *err)
{
    s->w16_stale = 1;
    if (s->res && s->be->upload(s->params, s->hparams, s->np * sizeof(float), err))
        return sl_err_wrap(err, "copying the parameters to %s", s->be->name);
    return 0;
}

void dev_stage_drop_views(dev_stage *s)
{
    if (s->hmv != s->mv) {
        sl_aligned_free(s->hmv);
        s->hmv = NULL;
    }
    sl_aligned_free(s->hmv16);
    s->hmv16 = NULL;
}

const char *dev_stage_backend(const dev_stage *s) { return s->be->name; }

static void head_free(const dev_stage *s, head_a *h)
{
    sl_aligned_free(h->idx);
    sl_aligned_free(h->tgt);
    if (s->res) {
        bfree(s, h->didx);
        bfree(s, h->dtgt);
        sl_aligned_free(h->hloss);
    }
    void *b[10] = {h->xm, h->d, h->g, h->l, h->mean, h->rstd, h->probs, h->losses, h->xm16, h->l16};
    for (int i = 0; i < 10; i++)
        bfree(s, b[i]);
    memset(h, 0, sizeof *h);
}

void dev_stage_free(dev_stage *s)
{
    if (!s)
        return;
    for (int i = 0; s->slots && i < s->nslots; i++) {
        slot *sl = &s->slots[i];
        bfree(s, sl->base);
        bfree(s, sl->dtok);
        bfree(s, sl->dseg);
        bfree(s, sl->dvalid);
        free(sl->l);
        head_free(s, &sl->h);
        cls_free(s, &sl->k);
    }
    free(s->slots);
    void *b[] = {s->params, s->grads, s->mv, s->dtied, s->wbase, s->etail, s->etmp, s->G0, s->G1, s->T1, s->T2, s->F1,
                 s->F2, s->X, s->dl, s->dg, s->dd, s->dxm, s->w16, s->A16, s->D16, s->L16, s->X16};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        bfree(s, b[i]);
    free(s->erow_of);
    free(s->erows);
    free(s->hetok);
    if (s->res) {
        bfree(s, s->detok);
        bfree(s, s->derows);
        sl_aligned_free(s->hparams);
        sl_aligned_free(s->hgrads);
        sl_aligned_free(s->htied);
    }
    dev_stage_drop_views(s);
    free(s->pp);
    free(s->gp);
    free(s->first);
    free(s->t);
    free(s);
}

const dev_config *dev_stage_config(const dev_stage *s) { return &s->c; }
void dev_stage_units(const dev_stage *s, int *u0, int *u1)
{
    *u0 = s->u0;
    *u1 = s->u1;
}
const dev_tensor *dev_stage_tensors(const dev_stage *s, int *n)
{
    *n = s->nt;
    return s->t;
}
float *dev_stage_params(dev_stage *s, size_t *n)
{
    if (n)
        *n = s->np;
    return s->hparams;
}
float *dev_stage_grads(dev_stage *s, size_t *n)
{
    if (n)
        *n = s->np;
    return s->hgrads;
}
float *dev_stage_optim_state(dev_stage *s, size_t *n)
{
    if (n)
        *n = s->np;
    return s->hmv;
}
int dev_stage_get_step(const dev_stage *s) { return s->step; }
int dev_stage_bf16_state(const dev_stage *s) { return s->bf16; }
void dev_stage_set_step(dev_stage *s, int step) { s->step = step; }
size_t dev_stage_bytes(const dev_stage *s) { return s->bytes; }

static kn_dropout drop_of(const dev_micro *mb, float p, int site, int unit)
{
    kn_dropout d;
    d.p = mb->train ? p : 0.0f;
    d.seed = sl_rng_stream(mb->seed, mb->step);
    if (mb->replica) /* replicas drop differently; replica 0 keeps one owner's keys */
        d.seed = sl_rng_stream(d.seed ^ 0x5245504C49434173ull, (uint64_t)mb->replica);
    d.stream = sl_rng_stream((uint64_t)site, (uint64_t)unit);
    d.seq0 = mb->seq0;
    return d;
}

/* Grows the head's stash of a slot to M masked rows. */
static int head_reserve(dev_stage *s, head_a *h, int M)
{
    if (M <= h->cap)
        return 0;
    size_t C = s->c.hidden, V = s->c.vocab, m = (size_t)M;
    size_t per = (s->bf16c ? 3 * C : 4 * C) + V + 6; /* floats per row (xm16, l16: C) */
    s->bytes -= (size_t)h->cap * per * sizeof(float);
    head_free(s, h);
    s->oom = 0;
    h->idx = sl_try_aligned_alloc(m * sizeof(int32_t));
    h->tgt = sl_try_aligned_alloc(m * sizeof(int32_t));
    if (!h->idx || !h->tgt)
        s->oom = 1;
    if (s->res) {
        h->didx = (int32_t *)falloc(s, m);
        h->dtgt = (int32_t *)falloc(s, m);
        h->hloss = halloc(s, m);
    }
    if (s->bf16c) {
        h->xm16 = (uint16_t *)falloc(s, (m * C + 1) / 2);
        h->l16 = (uint16_t *)falloc(s, (m * C + 1) / 2);
    } else {
        h->xm = falloc(s, m * C);
        h->l = falloc(s, m * C);
    }
    h->d = falloc(s, m * C);
    h->g = falloc(s, m * C);
    h->mean = falloc(s, m);
    h->rstd = falloc(s, m);
    h->probs = falloc(s, m * V);
    h->losses = falloc(s, m);
    if (s->oom) {
        head_free(s, h);
        return -1;
    }
    if (!s->res) {
        h->didx = h->idx;
        h->dtgt = h->tgt;
        h->hloss = h->losses;
    }
    s->bytes += m * per * sizeof(float);
    h->cap = M;
    return 0;
}

static int scratch_reserve(dev_stage *s, int M)
{
    if (M <= s->hcap)
        return 0;
    size_t C = s->c.hidden, m = (size_t)M, per = 4 * C; /* four (M,C) gradients */
    float **bufs[4] = {&s->dl, &s->dg, &s->dd, &s->dxm};
    for (int i = 0; i < 4; i++) {
        bfree(s, *bufs[i]);
        *bufs[i] = NULL;
    }
    s->oom = 0;
    for (int i = 0; i < 4; i++)
        *bufs[i] = falloc(s, m * C);
    s->bytes -= (size_t)s->hcap * per * sizeof(float);
    s->hcap = s->oom ? 0 : M;
    s->bytes += (size_t)s->hcap * per * sizeof(float);
    return s->oom ? -1 : 0;
}

/* ---- unit 0: embeddings ------------------------------------------------
 * tokens, segments (B,T) -> out (B,T,C) = dropout(LN(wte[tok] + wpe[t] + wse[seg])) */
static void embed_forward(dev_stage *s, slot *sl, const dev_micro *mb)
{
    float **p = s->pp + s->first[0];
    int B = mb->B, T = mb->T, C = s->c.hidden, N = B * T;
    embed_a *a = &sl->e;
    s->be->embed_forward(a->emb, sl->tok, sl->seg, p[0], p[1], p[2], B, T, C);
    s->be->layernorm_forward(a->out, a->mean, a->rstd, a->emb, p[3], p[4], N, C, s->c.ln_eps);
    s->be->dropout_forward(a->out, a->out, B, (size_t)T * C, drop_of(mb, s->c.hidden_dropout, SITE_EMBED, 0));
}

/* LOCAL role: room for `need` compact rows of the embeddings' tail (new
 * rows zeroed, used ones kept). */
static int etail_reserve(dev_stage *s, int need, sl_err *err)
{
    if (need <= s->ecap)
        return 0;
    size_t C = s->c.hidden;
    int cap = s->ecap * 2 > need ? s->ecap * 2 : need;
    if (cap > s->c.vocab)
        cap = s->c.vocab;
    float *t = s->be->alloc((size_t)cap * C * sizeof(float), err);
    float *x = t ? s->be->alloc((size_t)cap * C * sizeof(float), err) : NULL;
    int32_t *d = s->res && x ? s->be->alloc((size_t)cap * sizeof(int32_t), err) : NULL;
    int32_t *h = t && x && (d || !s->res) ? realloc(s->erows, (size_t)cap * sizeof(int32_t)) : NULL;
    if (h)
        s->erows = h;
    if (!h) { /* the backend's allocation said why, or the host's realloc failed */
        if (t && x && (d || !s->res))
            sl_err_set(err, SL_ENOMEM, "cannot grow the embedding gradient to %d rows", cap);
        bfree(s, t);
        bfree(s, x);
        bfree(s, d);
        return -1;
    }
    if (s->etail && s->be->copy(t, s->etail, (size_t)s->en * C * sizeof(float), err)) {
        bfree(s, t);
        bfree(s, x);
        bfree(s, d);
        return -1;
    }
    zero(s, t + (size_t)s->en * C, (size_t)(cap - s->en) * C);
    bfree(s, s->etail);
    bfree(s, s->etmp);
    if (s->res)
        bfree(s, s->derows);
    s->etail = t;
    s->etmp = x;
    s->derows = s->res ? d : s->erows;
    s->bytes += (size_t)(cap - s->ecap) * (2 * C * sizeof(float) + (s->res ? sizeof(int32_t) : 0));
    s->ecap = cap;
    return 0;
}

static int embed_backward(dev_stage *s, slot *sl, const dev_micro *mb, const float *dout,
                          sl_err *err)
{
    float **p = s->pp + s->first[0], **g = s->gp + s->first[0];
    int B = mb->B, T = mb->T, C = s->c.hidden, N = B * T;
    embed_a *a = &sl->e;
    zero(s, s->T1, (size_t)N * C);
    s->be->dropout_backward(s->T1, dout, B, (size_t)T * C, drop_of(mb, s->c.hidden_dropout, SITE_EMBED, 0));
    zero(s, s->T2, (size_t)N * C);
    s->be->layernorm_backward(s->T2, g[3], g[4], s->T1, a->emb, p[3], a->mean, a->rstd, N, C);
    if (!s->tied) {
        s->be->embed_backward(g[0], g[1], g[2], s->T2, sl->tok, sl->seg, B, T, C);
        return 0;
    }
    /* LOCAL: the word-embedding part into the compact tail */
    int most = s->en + N < s->c.vocab ? s->en + N : s->c.vocab;
    if (etail_reserve(s, most, err))
        return -1;
    for (int i = 0; i < N; i++) {
        int32_t t = mb->tokens[i];
        if (s->erow_of[t] < 0) {
            s->erow_of[t] = s->en;
            s->erows[s->en++] = t;
        }
        s->hetok[i] = s->erow_of[t];
    }
    if (s->res && s->be->upload(s->detok, s->hetok, (size_t)N * sizeof(int32_t), err))
        return -1;
    s->be->embed_backward(s->etail, g[1], g[2], s->T2, s->detok, sl->seg, B, T, C);
    return 0;
}

/* ---- units 1..L: encoder layer (post-LN) ---------------------------------
 * x (B,T,C) -> qkv = x Wqkv^T + b; a = attention(qkv); r1 = x + drop(a Wo^T + bo);
 * l1 = LN1(r1); h = l1 Wfc^T + bfc; r2 = l1 + drop(gelu(h) Wfo^T + bfo); out = LN2(r2) */
static void layer_forward(dev_stage *s, int u, layer_a *a, const float *x, const int32_t *valid,
                          const dev_micro *mb)
{
    float **p = s->pp + s->first[u - s->u0];
    int B = mb->B, T = mb->T, C = s->c.hidden, F = s->c.intermediate, N = B * T;
    size_t NC = (size_t)N * C;
    float eps = s->c.ln_eps;
    mm_fwd(s, a->qkv, x, p[0], p[1], N, C, 3 * C);
    s->be->attention_forward(a->atto, a->att, a->qkv, valid, B, T, C, s->c.heads,
                         drop_of(mb, s->c.attn_dropout, SITE_ATTN, u));
    mm_fwd(s, s->T1, a->atto, p[2], p[3], N, C, C);
    s->be->dropout_forward(s->T1, s->T1, B, (size_t)T * C, drop_of(mb, s->c.hidden_dropout, SITE_ATTN_OUT, u));
    s->be->residual_forward(a->res1, x, s->T1, NC);
    s->be->layernorm_forward(a->ln1, a->mean1, a->rstd1, a->res1, p[4], p[5], N, C, eps);
    mm_fwd(s, a->h, a->ln1, p[6], p[7], N, C, F);
    s->be->gelu_forward(s->F1, a->h, (size_t)N * F, s->c.gelu);
    mm_fwd(s, s->T1, s->F1, p[8], p[9], N, F, C);
    s->be->dropout_forward(s->T1, s->T1, B, (size_t)T * C, drop_of(mb, s->c.hidden_dropout, SITE_FFN_OUT, u));
    s->be->residual_forward(a->res2, a->ln1, s->T1, NC);
    s->be->layernorm_forward(a->out, a->mean2, a->rstd2, a->res2, p[10], p[11], N, C, eps);
}

/* Recomputes the P_CHEAP activations of layer u (l1, and the attention's
 * with recompute_attn) from its P_KEEP ones, as layer_forward computed them. */
static void layer_refresh(dev_stage *s, int u, layer_a *a, const int32_t *valid,
                          const dev_micro *mb)
{
    float **p = s->pp + s->first[u - s->u0];
    int B = mb->B, T = mb->T, N = B * T, C = s->c.hidden;
    if (s->recompute_attn && s->bf16c)
        s->be->attention_forward_bf16(a->atto16, a->att16, a->qkv16, valid, B, T, C, s->c.heads,
                                      drop_of(mb, s->c.attn_dropout, SITE_ATTN, u));
    else if (s->recompute_attn)
        s->be->attention_forward(a->atto, a->att, a->qkv, valid, B, T, C, s->c.heads,
                                 drop_of(mb, s->c.attn_dropout, SITE_ATTN, u));
    if (s->bf16c) /* the products read l1 rounded */
        s->be->layernorm_forward_bf16(a->ln1, s->L16, a->mean1, a->rstd1, a->res1, p[4], p[5], N,
                                      C, s->c.ln_eps);
    else
        s->be->layernorm_forward(a->ln1, a->mean1, a->rstd1, a->res1, p[4], p[5], N, C,
                                 s->c.ln_eps);
}

/* dout (B,T,C) -> dx (B,T,C) (overwritten), parameter gradients accumulated. */
static void layer_backward(dev_stage *s, int u, layer_a *a, const float *x, const dev_micro *mb,
                           const float *dout, float *dx)
{
    float **p = s->pp + s->first[u - s->u0], **g = s->gp + s->first[u - s->u0];
    int B = mb->B, T = mb->T, C = s->c.hidden, F = s->c.intermediate, N = B * T;
    size_t NC = (size_t)N * C, NF = (size_t)N * F;
    float *T1 = s->T1, *T2 = s->T2;
    zero(s, T1, NC);
    s->be->layernorm_backward(T1, g[10], g[11], dout, a->res2, p[10], a->mean2, a->rstd2, N, C);
    zero(s, T2, NC);
    s->be->dropout_backward(T2, T1, B, (size_t)T * C, drop_of(mb, s->c.hidden_dropout, SITE_FFN_OUT, u));
    s->be->gelu_forward(s->F2, a->h, NF, s->c.gelu);
    zero(s, s->F1, NF);
    mm_bwd(s, s->F1, g[8], g[9], T2, s->F2, p[8], N, F, C);
    zero(s, s->F2, NF);
    s->be->gelu_backward(s->F2, a->h, s->F1, NF, s->c.gelu);
    /* T1 holds d(res2), which is also the residual part of d(ln1). */
    mm_bwd(s, T1, g[6], g[7], s->F2, a->ln1, p[6], N, C, F);
    zero(s, T2, NC);
    s->be->layernorm_backward(T2, g[4], g[5], T1, a->res1, p[4], a->mean1, a->rstd1, N, C);
    dcopy(s, dx, T2, NC);
    zero(s, T1, NC);
    s->be->dropout_backward(T1, T2, B, (size_t)T * C, drop_of(mb, s->c.hidden_dropout, SITE_ATTN_OUT, u));
    zero(s, T2, NC);
    mm_bwd(s, T2, g[2], g[3], T1, a->atto, p[2], N, C, C);
    zero(s, s->Q, 3 * NC);
    s->be->attention_backward(s->Q, T2, a->qkv, a->att, B, T, C, s->c.heads,
                          drop_of(mb, s->c.attn_dropout, SITE_ATTN, u));
    mm_bwd(s, dx, g[0], g[1], s->Q, x, p[0], N, C, 3 * C);
}

/* ---- units 1..L in bf16 compute -------------------------------------------
 * The same layer with every product on bf16 operands (fp32 accumulation);
 * qkv, the attention probabilities and output and h are produced and kept
 * in bf16 (the products read nothing else of them; GELU reads bf16(h) in
 * both directions); x, r1, l1, r2, the LayerNorms, dropout and the
 * residuals stay fp32. The products read x rounded from X16, l1 from L16
 * (both written by the LayerNorms that make them) and gelu(h) from A16. */
static void layer_forward16(dev_stage *s, int u, layer_a *a, const float *x, const int32_t *valid,
                            const dev_micro *mb)
{
    float **p = s->pp + s->first[u - s->u0];
    int B = mb->B, T = mb->T, C = s->c.hidden, F = s->c.intermediate, N = B * T;
    size_t NC = (size_t)N * C;
    float eps = s->c.ln_eps;
    mm_fwd16(s, NULL, a->qkv16, x16_for(s, x, NC), w16_of(s, p[0]), p[1], N, C, 3 * C);
    s->be->attention_forward_bf16(a->atto16, a->att16, a->qkv16, valid, B, T, C, s->c.heads,
                                  drop_of(mb, s->c.attn_dropout, SITE_ATTN, u));
    mm_fwd16(s, s->T1, NULL, a->atto16, w16_of(s, p[2]), p[3], N, C, C);
    s->be->dropout_forward(s->T1, s->T1, B, (size_t)T * C, drop_of(mb, s->c.hidden_dropout, SITE_ATTN_OUT, u));
    s->be->residual_forward(a->res1, x, s->T1, NC);
    s->be->layernorm_forward_bf16(a->ln1, s->L16, a->mean1, a->rstd1, a->res1, p[4], p[5], N, C,
                                  eps);
    mm_fwd16(s, NULL, a->h16, s->L16, w16_of(s, p[6]), p[7], N, C, F);
    s->be->gelu_forward_bf16(s->A16, a->h16, (size_t)N * F, s->c.gelu);
    mm_fwd16(s, s->T1, NULL, s->A16, w16_of(s, p[8]), p[9], N, F, C);
    s->be->dropout_forward(s->T1, s->T1, B, (size_t)T * C, drop_of(mb, s->c.hidden_dropout, SITE_FFN_OUT, u));
    s->be->residual_forward(a->res2, a->ln1, s->T1, NC);
    /* the output, and rounded: the next layer's first product reads that */
    s->be->layernorm_forward_bf16(a->out, s->X16, a->mean2, a->rstd2, a->res2, p[10], p[11], N, C,
                                  eps);
    s->x16_of = a->out;
}

/* layer_backward in bf16 compute (each product rounds its output gradient;
 * its bias gradient sums the fp32 one). */
static void layer_backward16(dev_stage *s, int u, layer_a *a, const float *x, const dev_micro *mb,
                             const float *dout, float *dx)
{
    float **p = s->pp + s->first[u - s->u0], **g = s->gp + s->first[u - s->u0];
    int B = mb->B, T = mb->T, C = s->c.hidden, F = s->c.intermediate, N = B * T;
    size_t NC = (size_t)N * C, NF = (size_t)N * F;
    float *T1 = s->T1, *T2 = s->T2;
    zero(s, T1, NC);
    s->be->layernorm_backward(T1, g[10], g[11], dout, a->res2, p[10], a->mean2, a->rstd2, N, C);
    zero(s, T2, NC);
    s->be->dropout_backward(T2, T1, B, (size_t)T * C, drop_of(mb, s->c.hidden_dropout, SITE_FFN_OUT, u));
    /* d gelu(h) first, then one pass for gelu(h) (again) and dh, then the
     * weight gradient that reads gelu(h) */
    zero(s, s->F1, NF);
    mm_bwd16(s, s->F1, NULL, g[9], T2, NULL, w16_of(s, p[8]), N, F, C);
    zero(s, s->F2, NF);
    s->be->gelu_backward_bf16(s->F2, s->A16, a->h16, s->F1, NF, s->c.gelu);
    mm_bwd16(s, NULL, g[8], NULL, T2, s->A16, w16_of(s, p[8]), N, F, C);
    /* T1 holds d(res2), which is also the residual part of d(ln1); L16 holds
     * l1 rounded (layer_refresh, or the layer's forward again) */
    mm_bwd16(s, T1, g[6], g[7], s->F2, s->L16, w16_of(s, p[6]), N, C, F);
    zero(s, T2, NC);
    s->be->layernorm_backward(T2, g[4], g[5], T1, a->res1, p[4], a->mean1, a->rstd1, N, C);
    dcopy(s, dx, T2, NC);
    zero(s, T1, NC);
    s->be->dropout_backward(T1, T2, B, (size_t)T * C, drop_of(mb, s->c.hidden_dropout, SITE_ATTN_OUT, u));
    zero(s, T2, NC);
    mm_bwd16(s, T2, g[2], g[3], T1, a->atto16, w16_of(s, p[2]), N, C, C);
    s->be->to_bf16(s->D16, T2, NC);
    zero(s, s->Q, 3 * NC);
    s->be->attention_backward_bf16(s->Q, s->D16, a->qkv16, a->att16, B, T, C, s->c.heads,
                                   drop_of(mb, s->c.attn_dropout, SITE_ATTN, u));
    mm_bwd16(s, dx, g[0], g[1], s->Q, x16_for(s, x, NC), w16_of(s, p[0]), N, C, 3 * C);
}

static void layer_fwd(dev_stage *s, int u, layer_a *a, const float *x, const int32_t *valid,
                      const dev_micro *mb)
{
    if (s->bf16c)
        layer_forward16(s, u, a, x, valid, mb);
    else
        layer_forward(s, u, a, x, valid, mb);
}

static void layer_bwd(dev_stage *s, int u, layer_a *a, const float *x, const dev_micro *mb,
                      const float *dout, float *dx)
{
    if (s->bf16c)
        layer_backward16(s, u, a, x, mb, dout, dx);
    else
        layer_backward(s, u, a, x, mb, dout, dx);
}

/* ---- unit L+1: MLM head, only at the M masked positions ------------------
 * xm (M,C) = x[masked]; d = xm Wd^T + bd; g = gelu(d); l = LN(g);
 * logits (M,V) = l wte^T + bias; loss = sum of cross-entropies. */
static int head_forward(dev_stage *s, slot *sl, const float *x, const dev_micro *mb,
                        double *loss_sum, int *masked, sl_err *err)
{
    int B = mb->B, T = mb->T, C = s->c.hidden, V = s->c.vocab, N = B * T;
    float **p = s->pp + s->first[dev_unit_head(&s->c) - s->u0];
    head_a *h = &sl->h;
    int M = 0;
    for (int i = 0; i < N; i++) {
        int32_t y = mb->labels[i];
        if (y == -100)
            continue;
        if (y < 0 || y >= V)
            return sl_err_set(err, SL_EINVAL, "label %d at position %d outside the vocabulary (%d)",
                              y, i, V);
        M++;
    }
    *masked = M;
    *loss_sum = 0;
    h->M = 0;
    if (s->logits_out && (size_t)M * V > s->logits_cap)
        return sl_err_set(err, SL_EINVAL, "%d masked positions need %zu logits, room for %zu", M,
                          (size_t)M * V, s->logits_cap);
    if (M == 0)
        return 0;
    if (head_reserve(s, h, M) || scratch_reserve(s, M))
        return sl_err_set(err, SL_ENOMEM, "cannot allocate the MLM head's buffers for %d masked positions on %s",
                          M, s->be->name);
    h->M = M;
    for (int i = 0, j = 0; i < N; i++)
        if (mb->labels[i] != -100) {
            h->idx[j] = i;
            h->tgt[j] = mb->labels[i];
            j++;
        }
    size_t mi = (size_t)M * sizeof(int32_t);
    if (s->res && (s->be->upload(h->didx, h->idx, mi, err) || s->be->upload(h->dtgt, h->tgt, mi, err)))
        return -1;
    if (s->bf16c) { /* x[masked] and l rounded for their products (dxm, dl: scratch) */
        s->be->gather_rows(s->dxm, x, h->didx, M, C);
        s->be->to_bf16(h->xm16, s->dxm, (size_t)M * C);
        mm_fwd16(s, h->d, NULL, h->xm16, w16_of(s, p[0]), p[1], M, C, C);
        s->be->gelu_forward(h->g, h->d, (size_t)M * C, s->c.gelu);
        s->be->layernorm_forward(s->dl, h->mean, h->rstd, h->g, p[2], p[3], M, C, s->c.ln_eps);
        s->be->to_bf16(h->l16, s->dl, (size_t)M * C);
        mm_fwd16(s, h->probs, NULL, h->l16, w16_of(s, s->head_wte), p[4], M, C, V);
    } else {
        s->be->gather_rows(h->xm, x, h->didx, M, C);
        mm_fwd(s, h->d, h->xm, p[0], p[1], M, C, C);
        s->be->gelu_forward(h->g, h->d, (size_t)M * C, s->c.gelu);
        s->be->layernorm_forward(h->l, h->mean, h->rstd, h->g, p[2], p[3], M, C, s->c.ln_eps);
        /* the logits become the probabilities in place */
        mm_fwd(s, h->probs, h->l, s->head_wte, p[4], M, C, V);
    }
    if (s->logits_out &&
        s->be->download(s->logits_out, h->probs, (size_t)M * V * sizeof(float), err))
        return -1;
    s->be->crossentropy_forward(h->losses, h->probs, h->probs, h->dtgt, M, V);
    if (s->res && s->be->download(h->hloss, h->losses, (size_t)M * sizeof(float), err))
        return -1;
    double sum = 0;
    for (int j = 0; j < M; j++)
        sum += h->hloss[j];
    *loss_sum = sum;
    return 0;
}

/* -> dx (B,T,C) overwritten: the head's gradient at masked rows, 0 elsewhere. */
static void head_backward(dev_stage *s, slot *sl, const dev_micro *mb, float *dx)
{
    int C = s->c.hidden, V = s->c.vocab, N = mb->B * mb->T;
    int k = s->first[dev_unit_head(&s->c) - s->u0];
    float **p = s->pp + k, **g = s->gp + k;
    head_a *h = &sl->h;
    int M = h->M;
    zero(s, dx, (size_t)N * C);
    if (M == 0)
        return;
    size_t MC = (size_t)M * C;
    /* and the probabilities their gradient (consumes the slot's stash) */
    s->be->crossentropy_backward(h->probs, h->probs, h->dtgt, M, V, mb->loss_scale);
    zero(s, s->dl, MC);
    if (s->bf16c) {
        mm_bwd16(s, s->dl, s->head_gwte, g[4], h->probs, h->l16, w16_of(s, s->head_wte), M, C, V);
    } else {
        mm_bwd(s, s->dl, s->head_gwte, g[4], h->probs, h->l, s->head_wte, M, C, V);
    }
    zero(s, s->dg, MC);
    s->be->layernorm_backward(s->dg, g[2], g[3], s->dl, h->g, p[2], h->mean, h->rstd, M, C);
    zero(s, s->dd, MC);
    s->be->gelu_backward(s->dd, h->d, s->dg, MC, s->c.gelu);
    zero(s, s->dxm, MC);
    if (s->bf16c) {
        mm_bwd16(s, s->dxm, g[0], g[1], s->dd, h->xm16, w16_of(s, p[0]), M, C, C);
    } else {
        mm_bwd(s, s->dxm, g[0], g[1], s->dd, h->xm, p[0], M, C, C);
    }
    s->be->scatter_rows(dx, s->dxm, h->didx, M, C);
}

/* ---- unit L+1 to classify: pooler and classifier, one row per sequence ----
 * xc (B,C) = x[b, 0] (the [CLS] rows); pool = tanh(xc Wp^T + bp);
 * drop = dropout(pool); logits (B,K) = drop Wc^T + bc;
 * loss = sum of the cross-entropies of the labelled sequences (a sequence's
 * class is its label at position 0; -100 there: none). As Hugging Face's
 * BertForSequenceClassification (single_label_classification), dropout p =
 * classifier_dropout, else hidden_dropout_prob, keyed like every dropout. */
static void cls_free(const dev_stage *s, cls_a *k)
{
    sl_aligned_free(k->idx);
    sl_aligned_free(k->tgt);
    if (s->res) {
        bfree(s, k->didx);
        bfree(s, k->dtgt);
        sl_aligned_free(k->hloss);
    }
    float *b[7] = {k->xc, k->pool, k->drop, k->probs, k->losses, (float *)k->xc16,
                   (float *)k->drop16};
    for (int i = 0; i < 7; i++)
        bfree(s, b[i]);
    memset(k, 0, sizeof *k);
}

/* Every slot's rows, for micro-batches of up to maxB sequences. */
static int cls_alloc(dev_stage *s)
{
    size_t B = (size_t)s->maxB, C = s->c.hidden, K = s->c.num_labels;
    for (int i = 0; i < s->nslots; i++) {
        cls_a *k = &s->slots[i].k;
        k->idx = sl_try_aligned_alloc(B * sizeof(int32_t));
        k->tgt = sl_try_aligned_alloc(B * sizeof(int32_t));
        if (!k->idx || !k->tgt)
            s->oom = 1;
        if (s->res) {
            k->didx = (int32_t *)falloc(s, B);
            k->dtgt = (int32_t *)falloc(s, B);
            k->hloss = halloc(s, B);
        } else {
            k->didx = k->idx;
            k->dtgt = k->tgt;
        }
        if (s->bf16c) {
            k->xc16 = (uint16_t *)falloc(s, (B * C + 1) / 2);
            k->drop16 = (uint16_t *)falloc(s, (B * C + 1) / 2);
        } else {
            k->xc = falloc(s, B * C);
            k->drop = falloc(s, B * C);
        }
        k->pool = falloc(s, B * C);
        k->probs = falloc(s, B * K);
        k->losses = falloc(s, B);
        if (!s->res)
            k->hloss = k->losses;
        s->bytes += B * ((s->bf16c ? C : 3 * C) + K + 1) * sizeof(float) +
                    (s->bf16c ? 2 * B * C * sizeof(uint16_t) : 0) + 2 * B * sizeof(int32_t);
    }
    return s->oom ? -1 : 0;
}

static int cls_forward(dev_stage *s, slot *sl, const float *x, const dev_micro *mb,
                       double *loss_sum, int *labelled, sl_err *err)
{
    int B = mb->B, T = mb->T, C = s->c.hidden, K = s->c.num_labels, head = dev_unit_head(&s->c);
    float **p = s->pp + s->first[head - s->u0];
    cls_a *k = &sl->k;
    int n = 0;
    for (int b = 0; b < B; b++) {
        const int32_t *y = mb->labels + (size_t)b * T;
        for (int t = 1; t < T; t++)
            if (y[t] != -100)
                return sl_err_set(err, SL_EINVAL, "sequence %d has a label at position %d: a "
                                  "class belongs at position 0 ([CLS]) only", b, t);
        if (y[0] != -100 && (y[0] < 0 || y[0] >= K))
            return sl_err_set(err, SL_EINVAL, "class %d of sequence %d outside the model's %d "
                              "labels", y[0], b, K);
        k->idx[b] = b * T;
        k->tgt[b] = y[0];
        n += y[0] != -100;
    }
    *labelled = n;
    *loss_sum = 0;
    if (s->logits_out && (size_t)B * K > s->logits_cap)
        return sl_err_set(err, SL_EINVAL, "%d sequences need %zu logits, room for %zu", B,
                          (size_t)B * K, s->logits_cap);
    size_t bi = (size_t)B * sizeof(int32_t);
    if (s->res && (s->be->upload(k->didx, k->idx, bi, err) || s->be->upload(k->dtgt, k->tgt, bi, err)))
        return -1;
    kn_dropout drop = drop_of(mb, s->c.cls_dropout, SITE_CLASSIFIER, head);
    if (s->bf16c) { /* xc and drop rounded for their products (T1: scratch) */
        s->be->gather_rows(s->T1, x, k->didx, B, C);
        s->be->to_bf16(k->xc16, s->T1, (size_t)B * C);
        mm_fwd16(s, k->pool, NULL, k->xc16, w16_of(s, p[0]), p[1], B, C, C);
        s->be->tanh_forward(k->pool, k->pool, (size_t)B * C);
        s->be->dropout_forward(s->T1, k->pool, B, (size_t)C, drop);
        s->be->to_bf16(k->drop16, s->T1, (size_t)B * C);
        mm_fwd16(s, k->probs, NULL, k->drop16, w16_of(s, p[2]), p[3], B, C, K);
    } else {
        s->be->gather_rows(k->xc, x, k->didx, B, C);
        mm_fwd(s, k->pool, k->xc, p[0], p[1], B, C, C);
        s->be->tanh_forward(k->pool, k->pool, (size_t)B * C);
        s->be->dropout_forward(k->drop, k->pool, B, (size_t)C, drop);
        /* the logits become the probabilities in place */
        mm_fwd(s, k->probs, k->drop, p[2], p[3], B, C, K);
    }
    if (s->logits_out &&
        s->be->download(s->logits_out, k->probs, (size_t)B * K * sizeof(float), err))
        return -1;
    s->be->crossentropy_forward(k->losses, k->probs, k->probs, k->dtgt, B, K);
    if (s->res && s->be->download(k->hloss, k->losses, (size_t)B * sizeof(float), err))
        return -1;
    double sum = 0;
    for (int b = 0; b < B; b++)
        sum += k->hloss[b]; /* 0 for a sequence without a class */
    *loss_sum = sum;
    return 0;
}

/* -> dx (B,T,C) overwritten: the head's gradient at the [CLS] rows, 0
 * elsewhere. The (B,C) gradients in between use T1 and T2, which the
 * layers' backward overwrites only after this. */
static void cls_backward(dev_stage *s, slot *sl, const dev_micro *mb, float *dx)
{
    int B = mb->B, C = s->c.hidden, K = s->c.num_labels, head = dev_unit_head(&s->c);
    int f = s->first[head - s->u0];
    float **p = s->pp + f, **g = s->gp + f;
    cls_a *k = &sl->k;
    size_t BC = (size_t)B * C;
    zero(s, dx, (size_t)B * mb->T * C);
    /* the probabilities become their gradient (consumes the slot's stash) */
    s->be->crossentropy_backward(k->probs, k->probs, k->dtgt, B, K, mb->loss_scale);
    zero(s, s->T1, BC);
    if (s->bf16c)
        mm_bwd16(s, s->T1, g[2], g[3], k->probs, k->drop16, w16_of(s, p[2]), B, C, K);
    else
        mm_bwd(s, s->T1, g[2], g[3], k->probs, k->drop, p[2], B, C, K);
    zero(s, s->T2, BC);
    s->be->dropout_backward(s->T2, s->T1, B, (size_t)C,
                            drop_of(mb, s->c.cls_dropout, SITE_CLASSIFIER, head));
    zero(s, s->T1, BC);
    s->be->tanh_backward(s->T1, k->pool, s->T2, BC);
    zero(s, s->T2, BC);
    if (s->bf16c)
        mm_bwd16(s, s->T2, g[0], g[1], s->T1, k->xc16, w16_of(s, p[0]), B, C, C);
    else
        mm_bwd(s, s->T2, g[0], g[1], s->T1, k->xc, p[0], B, C, C);
    s->be->scatter_rows(dx, s->T2, k->didx, B, C);
}

static int check_micro(const dev_stage *s, int slot_i, const dev_micro *mb, sl_err *err)
{
    if (slot_i < 0 || slot_i >= s->nslots)
        return sl_err_set(err, SL_EINVAL, "stash slot %d outside 0..%d", slot_i, s->nslots - 1);
    if (mb->B < 1 || mb->B > s->maxB || mb->T != s->T)
        return sl_err_set(err, SL_EINVAL, "micro-batch %dx%d does not fit the stage (%dx%d)",
                          mb->B, mb->T, s->maxB, s->T);
    if (s->nl > 0 && !mb->valid)
        return sl_err_set(err, SL_EINVAL, "micro-batch without a valid mask");
    if (s->has_head && !mb->labels)
        return sl_err_set(err, SL_EINVAL, "micro-batch without labels");
    return 0;
}

/* Points the slot at the micro-batch's int inputs as the ops read them. On a
 * resident backend the forward uploads them and the backward reuses those
 * copies (same micro-batch); on the host the caller's arrays are used. */
static int bind_micro(dev_stage *s, slot *sl, const dev_micro *mb, int upload, sl_err *err)
{
    if (!s->res) {
        sl->tok = mb->tokens;
        sl->seg = mb->segments;
        sl->valid = mb->valid;
        return 0;
    }
    if (!upload)
        return 0;
    size_t b = (size_t)mb->B * mb->T * sizeof(int32_t);
    const int32_t *src[3] = {s->has_embed ? mb->tokens : NULL, s->has_embed ? mb->segments : NULL,
                             s->nl > 0 ? mb->valid : NULL};
    int32_t *dst[3] = {sl->dtok, sl->dseg, sl->dvalid};
    const int32_t **view[3] = {&sl->tok, &sl->seg, &sl->valid};
    for (int i = 0; i < 3; i++) {
        *view[i] = src[i] ? dst[i] : NULL;
        if (src[i] && s->be->upload(dst[i], src[i], b, err))
            return -1;
    }
    return 0;
}

/* The input of the slot's layer i (i = nl: the last layer's output). For
 * i > 0 on a stage that does not recompute, it is in X: put there by the
 * forward of layer i-1, or in backward by layer_output. */
static const float *layer_input(dev_stage *s, slot *sl, int i)
{
    if (i > 0)
        return s->recompute ? sl->l[i - 1].out : s->X;
    return s->has_embed ? sl->e.out : sl->in;
}

/* Recomputes layer u's output LN2(r2) into out, as layer_forward made it
 * (the statistics it rewrites are the same too). */
static void layer_output(dev_stage *s, int u, const layer_a *a, int N, float *out)
{
    float **p = s->pp + s->first[u - s->u0];
    if (s->bf16c) { /* and rounded, for the next layer's weight gradient */
        s->be->layernorm_forward_bf16(out, s->X16, a->mean2, a->rstd2, a->res2, p[10], p[11], N,
                                      s->c.hidden, s->c.ln_eps);
        s->x16_of = out;
    } else {
        s->be->layernorm_forward(out, a->mean2, a->rstd2, a->res2, p[10], p[11], N, s->c.hidden,
                                 s->c.ln_eps);
    }
}

int dev_stage_forward(dev_stage *s, int slot_i, const dev_micro *mb, const float *in, float *out,
                      double *loss_sum, int *masked, sl_err *err)
{
    if (check_micro(s, slot_i, mb, err))
        return -1;
    slot *sl = &s->slots[slot_i];
    size_t N = (size_t)mb->B * mb->T, C = s->c.hidden;
    sl->B = 0;
    if (s->has_embed) {
        if (!mb->tokens)
            return sl_err_set(err, SL_EINVAL, "micro-batch without tokens");
        for (size_t i = 0; i < N; i++) {
            if (mb->tokens[i] < 0 || mb->tokens[i] >= s->c.vocab)
                return sl_err_set(err, SL_EINVAL, "token %d at position %zu outside the vocabulary (%d)",
                                  mb->tokens[i], i, s->c.vocab);
            if (mb->segments && (mb->segments[i] < 0 || mb->segments[i] >= s->c.type_vocab))
                return sl_err_set(err, SL_EINVAL, "segment %d at position %zu outside 0..%d",
                                  mb->segments[i], i, s->c.type_vocab - 1);
        }
    } else if (!in) {
        return sl_err_set(err, SL_EINVAL, "stage starting at unit %d needs an input", s->u0);
    }
    if (bind_micro(s, sl, mb, 1, err))
        return bail(s);
    if (s->bf16c && s->w16_stale) { /* the products' weights, once per update */
        s->be->to_bf16(s->w16, s->params, s->np);
        s->w16_stale = 0;
    }
    if (s->has_embed)
        embed_forward(s, sl, mb);
    else if (s->be->upload(sl->in, in, N * C * sizeof(float), err))
        return bail(s);
    for (int i = 0; i < s->nl; i++) {
        layer_a a = sl->l[i];
        if (s->recompute) { /* the work area, but the output into the slot */
            a = s->work;
            a.out = sl->l[i].out;
        } else { /* the output into X, over the input when that is X too:
                  * layer_forward has read x for the last time by then */
            a.out = s->X;
        }
        layer_fwd(s, s->l0 + i, &a, layer_input(s, sl, i), sl->valid, mb);
    }
    const float *last = layer_input(s, sl, s->nl);
    if (s->cls) {
        if (cls_forward(s, sl, last, mb, loss_sum, masked, err))
            return bail(s);
    } else if (s->has_head) {
        if (head_forward(s, sl, last, mb, loss_sum, masked, err))
            return bail(s);
    } else if (out && s->be->download(out, last, N * C * sizeof(float), err)) {
        return bail(s);
    }
    if (check_fault(s, err))
        return bail(s);
    sl->B = mb->B;
    return 0;
}

int dev_stage_forward_logits(dev_stage *s, int slot, const dev_micro *mb, const float *in,
                             float *logits, size_t cap, int *M, double *loss_sum, sl_err *err)
{
    if (!s->has_head)
        return sl_err_set(err, SL_EINVAL, "units %d..%d: no MLM head, so no logits", s->u0, s->u1);
    s->logits_out = logits;
    s->logits_cap = cap;
    int rc = dev_stage_forward(s, slot, mb, in, NULL, loss_sum, M, err);
    s->logits_out = NULL;
    if (rc == 0 && s->cls)
        *M = mb->B; /* a row of logits for every sequence */
    return rc;
}

int dev_stage_backward(dev_stage *s, int slot_i, const dev_micro *mb, const float *dout, float *din,
                       sl_err *err)
{
    if (check_micro(s, slot_i, mb, err))
        return -1;
    slot *sl = &s->slots[slot_i];
    if (sl->B != mb->B)
        return sl_err_set(err, SL_ESTATE, "stash slot %d holds no forward of this micro-batch", slot_i);
    size_t NC = (size_t)mb->B * mb->T * s->c.hidden;
    float *cur = s->G0, *nxt = s->G1;
    if (!s->has_head && !dout)
        return sl_err_set(err, SL_EINVAL, "stage ending at unit %d needs an output gradient", s->u1);
    bind_micro(s, sl, mb, 0, err);
    sl->B = 0;
    if (s->cls)
        cls_backward(s, sl, mb, cur);
    else if (s->has_head)
        head_backward(s, sl, mb, cur);
    else if (s->be->upload(cur, dout, NC * sizeof(float), err))
        return bail(s);
    for (int i = s->nl - 1; i >= 0; i--) {
        layer_a *a = &sl->l[i];
        /* The same inputs, weights and dropout keys give bit for bit the
         * activations the forward had. */
        if (s->recompute) {
            /* the whole layer, into the work area (its output too, leaving
             * the slot's copy, the next layer's input, alone) */
            a = &s->work;
            layer_fwd(s, s->l0 + i, a, layer_input(s, sl, i), sl->valid, mb);
        } else {
            layer_refresh(s, s->l0 + i, a, sl->valid, mb);
            if (i > 0)
                layer_output(s, s->l0 + i - 1, &sl->l[i - 1], mb->B * mb->T, s->X);
        }
        layer_bwd(s, s->l0 + i, a, layer_input(s, sl, i), mb, cur, nxt);
        float *t = cur;
        cur = nxt;
        nxt = t;
    }
    if (s->has_embed) {
        if (embed_backward(s, sl, mb, cur, err))
            return bail(s);
    } else if (din && s->be->download(din, cur, NC * sizeof(float), err)) {
        return bail(s);
    }
    return check_fault(s, err);
}

int dev_stage_zero_grad(dev_stage *s, sl_err *err)
{
    zero(s, s->grads, s->np);
    if (s->en > 0) {
        zero(s, s->etail, (size_t)s->en * s->c.hidden);
        for (int j = 0; j < s->en; j++)
            s->erow_of[s->erows[j]] = -1;
        s->en = 0;
    }
    return check_fault(s, err);
}

int dev_stage_tied_role(const dev_stage *s)
{
    if (s->c.task == DEV_TASK_CLASSIFY)
        return DEV_TIED_NONE; /* the classification head shares nothing with unit 0 */
    if (s->has_embed && s->has_head)
        return DEV_TIED_LOCAL;
    if (s->has_embed)
        return DEV_TIED_EMBED;
    if (s->has_head)
        return DEV_TIED_HEAD;
    return DEV_TIED_NONE;
}

/* The backend's tied gradient (EMBED and HEAD roles), else NULL. */
static float *tied_buf(dev_stage *s)
{
    switch (dev_stage_tied_role(s)) {
    case DEV_TIED_EMBED:
        return s->gp[0];
    case DEV_TIED_HEAD:
        return s->head_gwte;
    default:
        return NULL;
    }
}

int dev_stage_tied_grad(dev_stage *s, const float **g, size_t *n, sl_err *err)
{
    *n = (size_t)s->c.vocab * s->c.hidden;
    *g = NULL;
    float *b = tied_buf(s);
    if (!b)
        return 0;
    if (!s->res) {
        *g = b;
        return 0;
    }
    if (!s->htied && !(s->htied = sl_try_aligned_alloc(*n * sizeof(float))))
        return sl_err_set(err, SL_ENOMEM, "cannot allocate the tied gradient's host copy");
    if (s->be->download(s->htied, b, *n * sizeof(float), err))
        return -1;
    *g = s->htied;
    return 0;
}

int dev_stage_tied_add(dev_stage *s, const float *other, sl_err *err)
{
    float *g = tied_buf(s);
    size_t n = (size_t)s->c.vocab * s->c.hidden;
    if (!g)
        return 0;
    const float *src = other;
    if (s->res) {
        if (!s->dtied && !(s->dtied = s->be->alloc(n * sizeof(float), err)))
            return -1;
        if (s->be->upload(s->dtied, other, n * sizeof(float), err))
            return -1;
        src = s->dtied;
    }
    s->be->residual_backward(g, NULL, src, n);
    return check_fault(s, err);
}

int dev_stage_grad_finish(dev_stage *s, sl_err *err)
{
    int n = s->en, C = s->c.hidden;
    if (s->etail && n > 0) {
        /* wte[erows] = head + embed, row by row (addition commutes, so this
         * is the split's embed + head bit for bit) */
        if (s->res && s->be->upload(s->derows, s->erows, (size_t)n * sizeof(int32_t), err))
            return -1;
        s->be->gather_rows(s->etmp, s->gp[0], s->derows, n, C);
        s->be->residual_backward(s->etmp, NULL, s->etail, (size_t)n * C);
        s->be->scatter_rows(s->gp[0], s->etmp, s->derows, n, C);
    }
    return check_fault(s, err);
}

int dev_stage_grad_sumsqs(dev_stage *s, double *sumsq, int *n, sl_err *err)
{
    int k = 0;
    for (int i = 0; i < s->nt; i++)
        if (!(s->t[i].flags & DEV_T_TIED))
            sumsq[k++] = s->be->sumsq(s->gp[i], s->t[i].numel);
    *n = k;
    return check_fault(s, err);
}

int dev_stage_step(dev_stage *s, const dev_optim *o, float grad_scale, sl_err *err)
{
    int t = s->step + 1;
    float lr = dev_optim_lr(o, t);
    if (s->bf16 && o->kind != DEV_OPT_ADAMW)
        return sl_err_set(err, SL_ENOTSUP, "bf16 optimizer state is implemented for AdamW only");
    /* AdamW scales the gradients (clipping) and writes the products' bf16
     * copy in its own pass over each tensor; LAMB, which takes norms of
     * the whole tensor between its passes, gets them done around it */
    int lamb = !s->bf16 && o->kind == DEV_OPT_LAMB;
    if (lamb && grad_scale != 1.0f)
        s->be->scale(s->grads, s->np, grad_scale);
    /* bf16 rounding draws: keyed by (run seed, step), then per tensor by its key */
    uint64_t rseed = sl_rng_stream(s->seed ^ 0x4F50543153524E44ull, (uint64_t)t);
    for (int k = 0; k < s->nt; k++) {
        const dev_tensor *x = &s->t[k];
        float wd = (x->flags & DEV_T_DECAY) ? o->wd : 0.0f;
        float *m = s->mv + x->offset, *v = s->mv + s->np + x->offset;
        uint16_t *w16 = s->bf16c ? s->w16 + x->offset : NULL;
        if (s->bf16) {
            uint16_t *m16 = (uint16_t *)s->mv + x->offset, *v16 = (uint16_t *)s->mv + s->np + x->offset;
            s->be->adamw_update_bf16(s->pp[k], s->gp[k], m16, v16, x->numel, lr, o->beta1, o->beta2,
                                     o->eps, wd, t, rseed, dev_tensor_key(x), grad_scale, w16);
        } else if (lamb) {
            s->be->lamb_update(s->pp[k], s->gp[k], m, v, x->numel, lr, o->beta1, o->beta2, o->eps, wd, t);
            if (w16) /* the products' copy, while the tensor is in cache */
                s->be->to_bf16(w16, s->pp[k], x->numel);
        } else {
            s->be->adamw_update(s->pp[k], s->gp[k], m, v, x->numel, lr, o->beta1, o->beta2, o->eps,
                                wd, t, grad_scale, w16);
        }
    }
    s->w16_stale = !s->bf16c;
    if (check_fault(s, err)) {
        s->w16_stale = 1;
        return sl_err_wrap(err, "optimizer step %d", t);
    }
    s->step = t;
    return 0;
}
