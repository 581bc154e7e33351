/* dev_pipe.c - the stage runner (dev_pipe.h). */
#include "dev_pipe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bal.h"
#include "sl_mem.h"
#include "sl_time.h"

struct dev_pipe {
    dev_stage *st;
    dev_pipe_cfg c;
    dev_port *port;
    dev_fed *fed;         /* a federation's state, or NULL */
    dev_sync *sync;
    int first, last, has_head, role;
    int Bm, slots;
    size_t nact, nmask;   /* one micro-batch's activation (Bm*T*C) and mask (Bm*T) */
    bal_op *ops;
    int nops;
    float *in, *out, *gin, *gout; /* boundary buffers (NULL where the stage has none) */
    int32_t *valid;       /* [slot]: a received micro-batch's mask, kept until its backward */
    dev_micro *mb;        /* [slot]: what the forward saw, for the backward */
    int32_t *labels;      /* the last stage without unit 0: the batch's labels */
    float *theirs;        /* the tied partner's partial gradient */
    size_t ntied;
    double *vals, *all;   /* this stage's gather values and everyone's */
    int nvals_max, all_cap;
    dev_pipe_times t;
    void (*trace)(void *ud, int stage, int kind, int mb);
    void *trace_ud;
    dev_pipe_seg *seg;    /* the last step's ops (dev_pipe_segments) */
    int nseg, seg_cap;
    double seg_t0;        /* when that step began */
};

_Static_assert((int)DEV_SEG_RECV_ACT == (int)BAL_OP_RECV_ACT && (int)DEV_SEG_FWD == (int)BAL_OP_FWD &&
               (int)DEV_SEG_SEND_ACT == (int)BAL_OP_SEND_ACT &&
               (int)DEV_SEG_RECV_GRAD == (int)BAL_OP_RECV_GRAD &&
               (int)DEV_SEG_BWD == (int)BAL_OP_BWD && (int)DEV_SEG_SEND_GRAD == (int)BAL_OP_SEND_GRAD,
               "the first segment kinds are bal_op kinds");

int dev_pipe_slots(const dev_pipe_cfg *c)
{
    if (c->stages < 1 || c->index < 0 || c->index >= c->stages || c->micro < 1)
        return -1;
    if (c->schedule == BAL_GPIPE)
        return c->micro;
    int warm = c->warmup < 0 ? c->stages - c->index - 1 : c->warmup;
    return warm + 1 < c->micro ? warm + 1 : c->micro;
}

static int check_cfg(const dev_stage *st, const dev_pipe_cfg *c, const dev_port *port, sl_err *err)
{
    if (c->stages < 1 || c->index < 0 || c->index >= c->stages)
        return sl_err_set(err, SL_EINVAL, "stage %d of %d", c->index, c->stages);
    if (c->schedule != BAL_1F1B && c->schedule != BAL_GPIPE)
        return sl_err_set(err, SL_EINVAL, "unknown schedule %d", c->schedule);
    if (c->B < 1 || c->micro < 1 || c->B % c->micro)
        return sl_err_set(err, SL_EINVAL, "batch %d is not a multiple of the micro-batch count %d",
                          c->B, c->micro);
    if (c->stages > 1 && !port)
        return sl_err_set(err, SL_EINVAL, "a pipeline of %d stages needs a port", c->stages);
    if (port && (port->stages != c->stages || port->index != c->index))
        return sl_err_set(err, SL_EINVAL, "the port is stage %d of %d, the runner %d of %d",
                          port->index, port->stages, c->index, c->stages);
    int u0, u1;
    dev_stage_units(st, &u0, &u1);
    int head = dev_unit_head(dev_stage_config(st));
    if ((c->index == 0) != (u0 == 0))
        return sl_err_set(err, SL_EINVAL, "stage %d holds units %d..%d: unit 0 (the embeddings) "
                          "belongs on the first stage and only there", c->index, u0, u1);
    if ((c->index == c->stages - 1) != (u1 == head))
        return sl_err_set(err, SL_EINVAL, "stage %d holds units %d..%d: unit %d (the head) "
                          "belongs on the last stage and only there", c->index, u0, u1, head);
    return 0;
}

dev_pipe *dev_pipe_create(dev_stage *st, const dev_pipe_cfg *cfg, dev_port *port, sl_err *err)
{
    if (check_cfg(st, cfg, port, err))
        return NULL;
    int slots = dev_pipe_slots(cfg);
    dev_pipe *pp = sl_xcalloc(1, sizeof *pp);
    pp->st = st;
    pp->c = *cfg;
    pp->port = port;
    pp->first = cfg->index == 0;
    pp->last = cfg->index == cfg->stages - 1;
    pp->has_head = pp->last;
    pp->role = dev_stage_tied_role(st);
    pp->Bm = cfg->B / cfg->micro;
    pp->slots = slots;
    const dev_config *c = dev_stage_config(st);
    pp->nmask = (size_t)pp->Bm * cfg->T;
    pp->nact = pp->nmask * (size_t)c->hidden;
    pp->ops = sl_xmalloc((size_t)BAL_STAGE_OPS_MAX(cfg->micro) * sizeof *pp->ops);
    pp->nops = bal_stage_ops(cfg->schedule, cfg->stages, cfg->index, cfg->micro, cfg->warmup,
                             pp->ops);
    pp->mb = sl_xcalloc((size_t)slots, sizeof *pp->mb);
    pp->seg_cap = pp->nops + 5; /* the ops, labels, sync, optimizer, outer step */
    pp->seg = sl_xcalloc((size_t)pp->seg_cap, sizeof *pp->seg);
    if (!pp->first) {
        pp->in = sl_try_aligned_alloc(pp->nact * sizeof(float));
        pp->gout = sl_try_aligned_alloc(pp->nact * sizeof(float));
        pp->valid = sl_try_malloc((size_t)slots * pp->nmask * sizeof(int32_t));
    }
    if (!pp->last) {
        pp->out = sl_try_aligned_alloc(pp->nact * sizeof(float));
        pp->gin = sl_try_aligned_alloc(pp->nact * sizeof(float));
    }
    if (pp->last && !pp->first)
        pp->labels = sl_try_malloc((size_t)cfg->B * cfg->T * sizeof(int32_t));
    if (pp->role == DEV_TIED_EMBED || pp->role == DEV_TIED_HEAD) {
        pp->ntied = (size_t)c->vocab * c->hidden;
        pp->theirs = sl_try_aligned_alloc(pp->ntied * sizeof(float));
    }
    int nt;
    dev_stage_tensors(st, &nt);
    pp->nvals_max = nt + 3;
    pp->vals = sl_xmalloc((size_t)pp->nvals_max * sizeof(double));
    /* every stage's tensors: the model's tensor count bounds the sum */
    pp->all_cap = 16 * (c->layers + 2) + 3 * cfg->stages + 16;
    pp->all = sl_xmalloc((size_t)pp->all_cap * sizeof(double));
    if ((!pp->first && (!pp->in || !pp->gout || !pp->valid)) ||
        (!pp->last && (!pp->out || !pp->gin)) || (pp->last && !pp->first && !pp->labels) ||
        (pp->ntied && !pp->theirs)) {
        dev_pipe_free(pp);
        sl_err_set(err, SL_ENOMEM, "stage %d: cannot allocate its boundary buffers",
                   cfg->index);
        return NULL;
    }
    return pp;
}

void dev_pipe_free(dev_pipe *pp)
{
    if (!pp)
        return;
    free(pp->ops);
    free(pp->mb);
    free(pp->seg);
    sl_aligned_free(pp->in);
    sl_aligned_free(pp->out);
    sl_aligned_free(pp->gin);
    sl_aligned_free(pp->gout);
    free(pp->valid);
    free(pp->labels);
    sl_aligned_free(pp->theirs);
    free(pp->vals);
    free(pp->all);
    dev_fed_free(pp->fed);
    free(pp);
}

dev_stage *dev_pipe_stage(dev_pipe *pp) { return pp->st; }

int dev_pipe_set_fed(dev_pipe *pp, const dev_fed_cfg *c, dev_sync *sync, sl_err *err)
{
    if (sync && sync->replica != pp->c.replica)
        return sl_err_set(err, SL_EINVAL, "stage %d of replica %d given replica %d's sync",
                          pp->c.index, pp->c.replica, sync->replica);
    dev_fed *f = dev_fed_create(pp->st, c, sync, err);
    if (!f)
        return -1;
    dev_fed_free(pp->fed);
    pp->fed = f;
    pp->sync = sync;
    return 0;
}

dev_fed *dev_pipe_fed(dev_pipe *pp) { return pp->fed; }

void dev_pipe_times_get(const dev_pipe *pp, dev_pipe_times *t) { *t = pp->t; }

int dev_pipe_segments(const dev_pipe *pp, const dev_pipe_seg **seg)
{
    *seg = pp->seg;
    return pp->nseg;
}

static void seg_add(dev_pipe *pp, int kind, int mb, double t0, double t1)
{
    if (pp->nseg < pp->seg_cap)
        pp->seg[pp->nseg++] = (dev_pipe_seg){kind, mb, t0 - pp->seg_t0, t1 - pp->seg_t0};
}

void dev_pipe_set_trace(dev_pipe *pp, void (*fn)(void *ud, int stage, int kind, int mb), void *ud)
{
    pp->trace = fn;
    pp->trace_ud = ud;
}

/* Stops the other stages too: they would wait for this one forever. */
static int fail(dev_pipe *pp, sl_err *err)
{
    if (pp->port || pp->sync) {
        char why[300];
        if (pp->sync)
            snprintf(why, sizeof why, "replica %d stage %d failed: %.230s", pp->c.replica,
                     pp->c.index, err->msg);
        else
            snprintf(why, sizeof why, "stage %d failed: %.240s", pp->c.index, err->msg);
        dev_port_abort(pp->port, why);
        dev_sync_abort(pp->sync, why);
    }
    return -1;
}

static int check_batch(const dev_pipe *pp, const dev_batch *b, sl_err *err)
{
    if (pp->first && !b)
        return sl_err_set(err, SL_EINVAL, "stage 0 needs the batch");
    if (b && (b->B != pp->c.B || b->T != pp->c.T))
        return sl_err_set(err, SL_EINVAL, "batch %dx%d, the pipeline was built for %dx%d", b->B,
                          b->T, pp->c.B, pp->c.T);
    return 0;
}

/* What the stage's forward and backward of micro-batch j see. On stage 0 it
 * comes from the batch, elsewhere from the received mask and (on the last
 * stage) the labels received at the start of the step. Dropout is keyed by
 * what every stage knows without being told: the step, and the place of the
 * micro-batch's first sequence in it (j * Bm). */
static dev_micro micro_of(const dev_pipe *pp, const dev_batch *b, int j, int slot, uint64_t step,
                          float scale, int train)
{
    size_t off = (size_t)j * pp->nmask;
    dev_micro mb = {.B = pp->Bm, .T = pp->c.T, .seq0 = (uint64_t)j * pp->Bm, .step = step,
                    .seed = pp->c.seed, .loss_scale = scale, .train = train,
                    .replica = pp->c.replica};
    if (pp->first) {
        mb.tokens = b->tokens + off;
        mb.segments = b->segments ? b->segments + off : NULL;
        mb.valid = b->valid + off;
        mb.labels = b->labels + off;
    } else {
        mb.valid = pp->valid + (size_t)slot * pp->nmask;
        mb.labels = pp->labels ? pp->labels + off : NULL;
    }
    return mb;
}

/* Takes the device's compute lock (if shared); the wait is time this stage
 * is idle, not computing: *t0 restarts after it. */
static void compute_begin(dev_pipe *pp, double *t0)
{
    if (pp->c.compute_lock) {
        pthread_mutex_lock(pp->c.compute_lock);
        double now = sl_now_s();
        pp->t.wait_s += now - *t0;
        *t0 = now;
    }
}

static void compute_end(dev_pipe *pp)
{
    if (pp->c.compute_lock)
        pthread_mutex_unlock(pp->c.compute_lock);
}

/* Labels and the masked count: stage 0 counts them and sends them to the
 * last stage (when that is another stage); the last stage receives them. */
static int step_labels(dev_pipe *pp, const dev_batch *b, int *total, sl_err *err)
{
    size_t N = (size_t)pp->c.B * pp->c.T;
    *total = 0;
    if (pp->first) {
        for (size_t i = 0; i < N; i++)
            *total += b->labels[i] != -100;
        if (!pp->last) {
            double t0 = sl_now_s();
            if (pp->port->ops->send_labels(pp->port, b->labels, N, *total, err))
                return -1;
            double t1 = sl_now_s();
            pp->t.send_s += t1 - t0;
            seg_add(pp, DEV_SEG_SEND_LABELS, -1, t0, t1);
        }
    } else if (pp->last) {
        double t0 = sl_now_s();
        if (pp->port->ops->recv_labels(pp->port, pp->labels, N, total, err))
            return -1;
        double t1 = sl_now_s();
        pp->t.recv_s += t1 - t0;
        seg_add(pp, DEV_SEG_RECV_LABELS, -1, t0, t1);
    }
    return 0;
}

/* Runs the ops of one step (or, with train = 0, the forwards only). */
static int run_ops(dev_pipe *pp, const dev_batch *b, uint64_t step, float scale, int train,
                   double *loss, int *masked, sl_err *err)
{
    dev_port *port = pp->port;
    for (int k = 0; k < pp->nops; k++) {
        const bal_op *op = &pp->ops[k];
        int j = op->mb, slot = j % pp->slots;
        if (!train && op->kind >= BAL_OP_RECV_GRAD)
            continue;
        if (pp->trace)
            pp->trace(pp->trace_ud, pp->c.index, op->kind, j);
        double t0 = sl_now_s();
        int rc = 0;
        switch (op->kind) {
        case BAL_OP_RECV_ACT:
            rc = port->ops->recv_act(port, j, pp->in, pp->nact, pp->valid + (size_t)slot * pp->nmask,
                                     pp->nmask, err);
            break;
        case BAL_OP_FWD: {
            pp->mb[slot] = micro_of(pp, b, j, slot, step, scale, train);
            double l = 0;
            int n = 0;
            compute_begin(pp, &t0);
            rc = dev_stage_forward(pp->st, slot, &pp->mb[slot], pp->in, pp->out, &l, &n, err);
            compute_end(pp);
            *loss += l;
            *masked += n;
            break;
        }
        case BAL_OP_SEND_ACT:
            rc = port->ops->send_act(port, j, pp->out, pp->nact, pp->mb[slot].valid, pp->nmask, err);
            break;
        case BAL_OP_RECV_GRAD:
            rc = port->ops->recv_grad(port, j, pp->gin, pp->nact, err);
            break;
        case BAL_OP_BWD:
            compute_begin(pp, &t0);
            rc = dev_stage_backward(pp->st, slot, &pp->mb[slot], pp->gin, pp->gout, err);
            compute_end(pp);
            break;
        case BAL_OP_SEND_GRAD:
            rc = port->ops->send_grad(port, j, pp->gout, pp->nact, err);
            break;
        }
        /* one clock read for the op's time and its segment: they add up alike */
        double t1 = sl_now_s();
        double *acc = op->kind == BAL_OP_FWD ? &pp->t.fwd_s : op->kind == BAL_OP_BWD ? &pp->t.bwd_s
                      : op->kind == BAL_OP_RECV_ACT || op->kind == BAL_OP_RECV_GRAD ? &pp->t.recv_s
                                                                                   : &pp->t.send_s;
        *acc += t1 - t0;
        if (rc)
            return sl_err_wrap(err, "stage %d, micro-batch %d", pp->c.index, j);
        seg_add(pp, op->kind, j, t0, t1);
    }
    return 0;
}

/* Every stage's [loss sum, masked, count, values...] in stage order. */
static int gather(dev_pipe *pp, int n, sl_err *err)
{
    if (!pp->port) {
        memcpy(pp->all, pp->vals, (size_t)n * sizeof(double));
        return n;
    }
    int got;
    if (pp->port->ops->gather(pp->port, pp->vals, n, pp->all, pp->all_cap, &got, err))
        return -1;
    return got;
}

static void reset_times(dev_pipe *pp)
{
    memset(&pp->t, 0, sizeof pp->t);
    pp->nseg = 0;
    pp->seg_t0 = sl_now_s();
}

int dev_pipe_grads(dev_pipe *pp, const dev_batch *b, uint64_t step, dev_step_info *info,
                   sl_err *err)
{
    double t_step = sl_now_s();
    reset_times(pp);
    if (check_batch(pp, b, err))
        return fail(pp, err);
    /* a run's first step, after --init and unless a checkpoint restored it */
    if (pp->fed && !dev_fed_ready(pp->fed) && dev_fed_begin(pp->fed, err))
        return fail(pp, err);
    if (pp->port && pp->port->ops->begin(pp->port, step, err))
        return fail(pp, err);
    if (dev_stage_zero_grad(pp->st, err))
        return fail(pp, err);
    int total = 0;
    if (step_labels(pp, b, &total, err))
        return fail(pp, err);
    float scale = total ? 1.0f / (float)total : 0.0f;
    double loss = 0;
    int masked = 0;
    if (run_ops(pp, b, step, scale, 1, &loss, &masked, err))
        return fail(pp, err);
    double t0 = sl_now_s();
    if (dev_stage_grad_finish(pp->st, err))
        return fail(pp, err);
    if (pp->theirs) {
        const float *mine;
        size_t n;
        if (dev_stage_tied_grad(pp->st, &mine, &n, err) ||
            pp->port->ops->tied_exchange(pp->port, mine, pp->theirs, n, err) ||
            dev_stage_tied_add(pp->st, pp->theirs, err)) {
            sl_err_wrap(err, "stage %d: tied embeddings", pp->c.index);
            return fail(pp, err);
        }
    }
    if (pp->fed && dev_fed_config(pp->fed)->mode == DEV_SYNC_STEP) {
        double r0 = sl_now_s();
        int rc = dev_fed_grads(pp->fed, step, err);
        pp->t.replica_s += sl_now_s() - r0;
        if (rc) {
            sl_err_wrap(err, "stage %d: replica sync", pp->c.index);
            return fail(pp, err);
        }
    }
    int n;
    if (dev_stage_grad_sumsqs(pp->st, pp->vals + 3, &n, err))
        return fail(pp, err);
    pp->vals[0] = pp->has_head ? loss : 0.0;
    pp->vals[1] = pp->has_head ? (double)total : 0.0;
    pp->vals[2] = n;
    int got = gather(pp, n + 3, err);
    if (got < 0)
        return fail(pp, err);
    double sumsq = 0, loss_all = 0, total_all = 0;
    for (int k = 0; k + 3 <= got;) {
        loss_all += pp->all[k];
        total_all += pp->all[k + 1];
        int c = (int)pp->all[k + 2];
        if (c < 0 || k + 3 + c > got) {
            sl_err_set(err, SL_ECORRUPT, "stage %d: a malformed gather", pp->c.index);
            return fail(pp, err);
        }
        for (int i = 0; i < c; i++)
            sumsq += pp->all[k + 3 + i];
        k += 3 + c;
    }
    info->masked = (int)total_all;
    info->loss = total_all > 0 ? loss_all / total_all : 0.0;
    info->grad_norm = sqrt(sumsq);
    info->lr = 0;
    double t1 = sl_now_s();
    pp->t.finish_s += t1 - t0;
    pp->t.step_s = t1 - t_step;
    seg_add(pp, DEV_SEG_SYNC, -1, t0, t1);
    return 0;
}

int dev_pipe_step(dev_pipe *pp, const dev_batch *b, const dev_optim *o, dev_step_info *info,
                  sl_err *err)
{
    uint64_t step = (uint64_t)dev_stage_get_step(pp->st) + 1;
    double t_step = sl_now_s();
    if (dev_pipe_grads(pp, b, step, info, err))
        return -1;
    double t0 = sl_now_s();
    float clip = dev_clip_scale(info->grad_norm, o->clip);
    info->lr = dev_optim_lr(o, (int)step);
    compute_begin(pp, &t0);
    int rc = dev_stage_step(pp->st, o, clip, err);
    compute_end(pp);
    if (rc) {
        sl_err_wrap(err, "stage %d", pp->c.index);
        return fail(pp, err);
    }
    double t1 = sl_now_s();
    pp->t.finish_s += t1 - t0;
    pp->t.step_s = t1 - t_step;
    seg_add(pp, DEV_SEG_OPTIM, -1, t0, t1);
    if (pp->fed && dev_fed_outer_due(pp->fed, step)) {
        /* not under the compute lock: the other stage of this device may
         * still have to reach the round */
        t0 = t1;
        rc = dev_fed_outer(pp->fed, step, err);
        if (rc) {
            sl_err_wrap(err, "stage %d: outer step %llu", pp->c.index, (unsigned long long)step);
            return fail(pp, err);
        }
        t1 = sl_now_s();
        pp->t.replica_s += t1 - t0;
        pp->t.finish_s += t1 - t0;
        pp->t.step_s = t1 - t_step;
        seg_add(pp, DEV_SEG_SYNC, -1, t0, t1);
    }
    return 0;
}

int dev_pipe_eval(dev_pipe *pp, const dev_batch *b, double *loss_sum, int *masked, sl_err *err)
{
    reset_times(pp);
    if (check_batch(pp, b, err))
        return fail(pp, err);
    if (pp->port && pp->port->ops->begin(pp->port, 0, err))
        return fail(pp, err);
    int total = 0;
    if (step_labels(pp, b, &total, err))
        return fail(pp, err);
    double loss = 0;
    int k = 0;
    if (run_ops(pp, b, 0, 0.0f, 0, &loss, &k, err))
        return fail(pp, err);
    pp->vals[0] = pp->has_head ? loss : 0.0;
    pp->vals[1] = pp->has_head ? (double)k : 0.0;
    pp->vals[2] = 0;
    int got = gather(pp, 3, err);
    if (got < 0)
        return fail(pp, err);
    *loss_sum = 0;
    double m = 0;
    for (int i = 0; i + 3 <= got; i += 3) {
        *loss_sum += pp->all[i];
        m += pp->all[i + 1];
    }
    *masked = (int)m;
    return 0;
}
